"""The latency study's report (written next)."""


def write_report(cfg) -> None:
    raise NotImplementedError
