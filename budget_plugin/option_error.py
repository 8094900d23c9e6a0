"""How a bad option is refused: one line naming the option and what it accepts."""


class OptionError(SystemExit, ValueError):
    """A bad option. A ValueError to Python callers; a SystemExit, so that fairseq's
    command-line tools, which catch nothing, print its one line (``error: ...``) and
    exit 1 instead of a traceback."""

    def __init__(self, message: str):
        super().__init__(message)
        self.code = f"error: {message}"


def require(ok: bool, option: str, allowed: str, value):
    """Refuse a bad setting, naming the option (``head_ratio`` -> ``--head-ratio``) and
    its range."""
    if not ok:
        raise OptionError(f"--{option.replace('_', '-')} must be {allowed}, got {value!r}")
