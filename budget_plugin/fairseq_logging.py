"""fairseq's text-to-speech tasks call ``logging.basicConfig(level=INFO)`` when
``fairseq.tasks`` is imported, so a program that imports the plugin (a command, a
notebook, the hub) would print fairseq's INFO lines on stderr. fairseq's own command-line
tools configure logging before they import a ``--user-dir``, so there this changes
nothing."""

import contextlib
import logging


@contextlib.contextmanager
def logging_left_alone():
    """Within the block, ``logging.basicConfig`` does nothing (it configures only a
    root logger without handlers): a stand-in handler is there, and then removed."""
    root = logging.getLogger()
    stand_in = logging.NullHandler()
    root.addHandler(stand_in)
    try:
        yield
    finally:
        root.removeHandler(stand_in)
