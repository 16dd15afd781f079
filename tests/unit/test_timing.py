"""The one loop of interleaved timed rounds (xnnfold.pte.timing.medians_interleaved): warm-up
rounds untimed, each variant once per round, a median per measured column."""

from xnnfold.pte.timing import medians_interleaved


def test_warmup_rounds_are_left_out_and_each_column_has_its_median():
    calls = []

    def measure(subject):
        calls.append(subject["name"])
        subject["n"] += 1
        return float(subject["n"]), 10.0 * subject["n"]

    subjects = {"a": {"name": "a", "n": 0}, "b": {"name": "b", "n": 0}}
    medians = medians_interleaved(subjects, measure, rounds=3, warmup=2, seed=0)
    assert sorted(calls) == ["a"] * 5 + ["b"] * 5        # each variant once per round
    assert medians == {"a": (4.0, 40.0), "b": (4.0, 40.0)}   # calls 3, 4, 5 timed
