"""How a model folder's engine runs: the one object the CLI's flags fill and that ``serve``, the service and
``load.load_engine`` hand on unchanged, so a setting is named once and checked once."""

from __future__ import annotations

from dataclasses import dataclass

from aiayn.engines import DEVICES, ENGINES, ONNX, VARIANTS, default_cores


@dataclass(frozen=True)
class EngineOptions:
    """Which engine runs which weights where, and how it uses the cores: ``lanes`` searches at once (on a CPU, each
    one batch over the shared sessions), each on ``threads`` ONNX Runtime intra-op threads. The defaults are the
    fastest measured on our 2-core machines (``aiayn bench``): a lane per core, one thread each, since a step's ops
    are too small at this model's size for a second thread to gain while a second lane searches another batch."""

    engine: str = ONNX  # one of ``ENGINES``: onnx takes the fastest ONNX Runtime engine for the device
    device: str = "auto"  # one of ``DEVICES``: auto is a GPU where one really works, else the CPU
    variant: str = "fp32"  # the weights, one of ``VARIANTS`` (the table ``aiayn.engines.WEIGHTS``)
    lanes: int | None = None  # None: as many as the cores allow (``default_cores``, at most ``MAX_CORES``)
    threads: int = 1  # ONNX Runtime's intra-op threads in each lane

    def __post_init__(self) -> None:
        for what, value, choices in (
            ("engine", self.engine, ENGINES),
            ("device", self.device, DEVICES),
            ("variant", self.variant, VARIANTS),
        ):
            if value not in choices:
                raise ValueError(f"unknown {what} {value!r}; choose one of {', '.join(choices)}")
        if self.lanes is not None and self.lanes < 1 or self.threads < 1:
            raise ValueError(f"lanes ({self.lanes}) and threads per lane ({self.threads}) must be at least 1")

    @classmethod
    def for_cores(
        cls, engine: str, device: str, variant: str, cores: int | None, threads_per_lane: int = 1
    ) -> EngineOptions:
        """The options of the CLI's flags: ``cores`` cores (None: the machine's) cut into lanes of
        ``threads_per_lane`` threads; a ValueError in one line where they do not divide."""
        if cores is not None and cores % threads_per_lane:
            raise ValueError(
                f"--cores {cores} does not split into lanes of --threads-per-lane {threads_per_lane}: "
                f"give --cores a multiple of {threads_per_lane}"
            )
        lanes = None if cores is None else cores // threads_per_lane
        return cls(engine, device, variant, lanes, threads_per_lane)

    @property
    def lane_count(self) -> int:
        """The lanes that run: ``lanes``, or the machine's cores divided into lanes of ``threads``."""
        return self.lanes or max(1, default_cores() // self.threads)


DEFAULT_OPTIONS = EngineOptions()  # the page's and the CLI's defaults
