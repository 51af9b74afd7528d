"""autobyte: communication scheduling for data-parallel training.

The PyTorch plugin lives in ``autobyte.torch``::

    import autobyte.torch as ab
    ab.init()
    optimizer = ab.DistributedOptimizer(optimizer, model)

``python -m autobyte.profile`` measures a model's per-layer compute for
``autobyte sim --profile``. The engine itself is Go (``cmd/libautobyte``),
loaded with ctypes by ``autobyte._native``.
"""

__all__ = ["AutobyteError"]


class AutobyteError(RuntimeError):
    """A failure of the autobyte engine or of its use (the message says which)."""
