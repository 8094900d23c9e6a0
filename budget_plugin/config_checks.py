"""One way to refuse a bad setting: at build time, naming the option and its range."""


def require(ok: bool, option: str, allowed: str, value):
    if not ok:
        raise ValueError(f"--{option} must be {allowed}, got {value!r}")
