"""transformers, imported for the exports and the zoo: a torchvision wheel that does not load on
this torch is hidden while transformers and its model modules import (:func:`import_transformers`),
and a transformers that does not import is one line (:class:`TransformersUnavailable`)."""

from __future__ import annotations

import contextlib
import sys


class TransformersUnavailable(RuntimeError):
    """transformers does not import here (one line: why, and how to install it)."""


@contextlib.contextmanager
def _without_broken_torchvision():
    """transformers imports torchvision whenever it is installed; a wheel that does not load on
    this torch (a CUDA build: ``operator torchvision::nms does not exist``) would take every
    transformers model down with it. None of the zoo needs it: while transformers and its model
    modules import, a broken torchvision reads as not installed; afterwards ``sys.modules`` is
    as it was (no process-wide change: another caller's ``import torchvision`` still fails
    with its own error)."""
    try:
        import torchvision  # noqa: F401
        broken = False
    except Exception:  # noqa: BLE001 - whatever breaks it, the zoo does without it
        broken = True
    if not broken:                            # it loads: nothing to hide
        yield
        return
    saved = {n: m for n, m in sys.modules.items()
             if n == "torchvision" or n.startswith("torchvision.")}
    for name in saved:
        del sys.modules[name]
    sys.modules["torchvision"] = None         # find_spec and import now say: not installed
    try:
        yield
    finally:
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        sys.modules.update(saved)


class _Guarded:
    """transformers, whose lazily imported names (``tf.ViTModel`` imports its modeling module)
    are looked up with a broken torchvision hidden."""

    def __init__(self, module):
        self._module = module

    def __getattr__(self, name):
        with _without_broken_torchvision():
            return getattr(self._module, name)


def import_transformers():
    """transformers, imported with a broken torchvision hidden (:class:`_Guarded`), or
    :class:`TransformersUnavailable`."""
    with _without_broken_torchvision():
        try:
            import transformers
        except Exception as error:  # noqa: BLE001 - any import failure means: skip, say why
            raise TransformersUnavailable(f"transformers does not import ({type(error).__name__}: "
                                 f"{str(error).splitlines()[0][:120]}); pip install -e '.[zoo]'")
    return _Guarded(transformers)
