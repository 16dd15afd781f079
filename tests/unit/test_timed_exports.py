"""The export benches read wall time and peak resident set from /usr/bin/time -v's report."""

from xnnfold.bench import multimodal_optimum, timed_command

REPORT = """something the export printed
\tElapsed (wall clock) time (h:mm:ss or m:ss): 1:02:03.50
\tMaximum resident set size (kbytes): 7985392
"""


def test_the_report_gives_seconds_and_kib(tmp_path):
    log = tmp_path / "export.log"
    log.write_text(REPORT)
    assert timed_command.time_report(log) == (3723.5, 7985392)
    assert timed_command.time_report(tmp_path / "missing.log") == (None, None)


def test_the_multimodal_table_gives_gigabytes_of_bytes_not_of_kib(tmp_path):
    # /usr/bin/time's "kbytes" are KiB: 7,985,392 KiB is 8.177 GB (not 7.985)
    log = tmp_path / "export.log"
    log.write_text(REPORT)
    seconds, gigabytes = multimodal_optimum._measured(log)
    assert seconds == 3723.5
    assert abs(gigabytes - 8.1770414) < 1e-6
