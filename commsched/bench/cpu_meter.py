"""How busy this machine's cores were over a stretch of time, from /proc/stat: a benchmark whose
cores were busy nearly all the time was paced by its CPU, not by what it set out to measure."""

from __future__ import annotations

# A stretch that kept the cores busier than this was paced by the CPU.
CPU_BOUND = 0.90


class CpuMeter:
    """The fraction of time every core of the machine was busy since the meter was made (0 where
    /proc/stat cannot be read)."""

    def __init__(self) -> None:
        self._start = self._read()

    @staticmethod
    def _read() -> tuple[int, int]:
        try:
            with open("/proc/stat", encoding="ascii") as handle:
                fields = [int(v) for v in handle.readline().split()[1:9]]
        except (OSError, ValueError):
            return 0, 0
        idle = fields[3] + fields[4]  # idle, iowait
        return sum(fields) - idle, sum(fields)

    def busy(self) -> float:
        busy, total = self.since()
        return busy / max(total, 1)

    def since(self) -> tuple[int, int]:
        """Busy and total core time (clock ticks) since the meter was made."""
        busy, total = self._read()
        return busy - self._start[0], total - self._start[1]


class CpuTally:
    """How busy the cores were over the stretches measured with it, added up: one candidate's
    timed rounds, between which other candidates ran."""

    def __init__(self) -> None:
        self.busy = 0
        self.total = 0
        self._meter: CpuMeter | None = None

    def start(self) -> None:
        self._meter = CpuMeter()

    def stop(self) -> None:
        if self._meter is None:
            raise RuntimeError("CpuTally.stop() without start()")
        busy, total = self._meter.since()
        self.busy, self.total, self._meter = self.busy + busy, self.total + total, None

    def fraction(self) -> float | None:
        """The busy share of the stretches measured (None until they add up to one tick of the
        kernel's clock)."""
        return self.busy / self.total if self.total > 0 else None
