"""A GPU's SM clock, power draw and temperature while code runs, sampled by `nvidia-smi` in the background.

Why: an H100 or H200 under a sustained tensor-core load runs at its board power limit (700 W), where
the driver lowers the SM clock until the power fits. Two kernels doing the same work then differ in
time by their clocks as well as by their clock cycles, and the one that draws more power per cycle runs
at the lower clock. A table of times that records each implementation's clock and power while it was
timed lets a ratio of times be read as a ratio of cycles times a ratio of clocks.

`nvidia-smi --query-gpu ... --loop-ms INTERVAL -f FILE` writes one CSV line per sample into a file (a pipe
would fill and stall it during a long run). Its timestamps are the host's local time, which `window`
compares with `time.time()` on the same host. Where there is no CUDA device or no `nvidia-smi`, the
telemetry records nothing and says why (`unavailable`); its summaries are then NaN.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import subprocess
import tempfile
from datetime import datetime
from pathlib import Path

import pandas as pd
import torch

QUERY = ("timestamp", "clocks.sm", "power.draw", "temperature.gpu", "clocks_throttle_reasons.active")
SAMPLE_COLUMNS = ["t", "sm_mhz", "power_w", "temp_c", "reasons"]
# NVML's clock event reasons (nvmlClocksEventReason*), the bits of clocks_throttle_reasons.active
REASONS = {
    0x1: "idle",
    0x2: "applications clocks",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake",
    0x100: "display clock",
}
POWER_CAP = 0x4


def reason_names(mask: int) -> list[str]:
    """The clock event reasons set in `mask`, in bit order."""
    return [name for bit, name in REASONS.items() if mask & bit]


def _number(text: str) -> float:
    """A value of nvidia-smi's CSV (no units); "[N/A]", "[Not Supported]" and the like are NaN."""
    try:
        return float(text)
    except ValueError:
        return math.nan


def parse_samples(lines) -> pd.DataFrame:
    """`SAMPLE_COLUMNS` from nvidia-smi's `--format=csv,noheader,nounits` lines of `QUERY`: t in seconds
    since the epoch (the timestamp read as local time), the reasons as an integer mask. Lines that are not
    samples (a cut last line, a message) are skipped."""
    rows = []
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != len(QUERY):
            continue
        try:
            t = datetime.strptime(fields[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            reasons = int(fields[4], 16)
        except ValueError:
            continue
        rows.append(
            dict(t=t, sm_mhz=_number(fields[1]), power_w=_number(fields[2]), temp_c=_number(fields[3]), reasons=reasons)
        )
    return pd.DataFrame(rows, columns=SAMPLE_COLUMNS)


def summarize(samples: pd.DataFrame) -> dict:
    """Median SM clock (MHz) and power (W), highest temperature, and the share of samples at the power cap."""
    if samples.empty:
        return dict(sm_mhz=math.nan, power_w=math.nan, temp_c=math.nan, power_capped=math.nan, samples=0)
    return dict(
        sm_mhz=float(samples.sm_mhz.median()),
        power_w=float(samples.power_w.median()),
        temp_c=float(samples.temp_c.max()),
        power_capped=float(((samples.reasons & POWER_CAP) != 0).mean()),
        samples=len(samples),
    )


# A multi-GPU run's per-GPU lists (as the leaderboard command records them) and the one number a table keeps of
# each: (list column, summary column, `across_gpus`'s how).
RUN_SUMMARIES = (("sm_mhz_by_gpu", "sm_mhz", "min"), ("power_capped_by_gpu", "power_capped", "max"))


def across_gpus(values, how: str) -> float | None:
    """One run's per-GPU list reduced to one number: `how` "min" (the slower GPU's clock, which sets a
    data-parallel step's pace) or "max" (the largest share at the power cap), NaN skipped. `values` as recorded
    (a list) or as a CSV cell holds it (its JSON text); None where the run has no list."""
    if isinstance(values, str):
        values = json.loads(values)
    if not isinstance(values, list) or not values:
        return None
    return float(pd.Series(values, dtype=float).agg(how))


class GpuTelemetry:
    """Samples of one CUDA device every `interval_ms` while the `with` block runs (module docstring).

    with GpuTelemetry("cuda") as telemetry:
        t0 = time.time(); run(); t1 = time.time()
    telemetry.window(t0, t1)  # {'sm_mhz': ..., 'power_w': ..., 'temp_c': ..., 'power_capped': ..., 'samples': ...}
    """

    def __init__(self, device: torch.device | str | int = "cuda", interval_ms: int = 100):
        if interval_ms < 1:
            raise ValueError(f"interval_ms must be at least 1, got {interval_ms}")
        self.device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        self.interval_ms = interval_ms
        self.samples = pd.DataFrame(columns=SAMPLE_COLUMNS)
        self.unavailable: str | None = None
        self._process: subprocess.Popen | None = None
        self._folder: tempfile.TemporaryDirectory | None = None

    def gpu_id(self) -> str:
        """nvidia-smi's id of the device: its UUID, which CUDA_VISIBLE_DEVICES's renumbering does not change."""
        return f"GPU-{torch.cuda.get_device_properties(self.device).uuid}"

    def __enter__(self) -> GpuTelemetry:
        executable = shutil.which("nvidia-smi")
        if self.device.type != "cuda" or not torch.cuda.is_available():
            self.unavailable = f"no CUDA device ({self.device})"
        elif executable is None:
            self.unavailable = "nvidia-smi is not on PATH"
        if self.unavailable:
            return self
        self._folder = tempfile.TemporaryDirectory(prefix="gpu_telemetry_")
        command = [
            executable,
            f"--id={self.gpu_id()}",
            "--query-gpu=" + ",".join(QUERY),
            "--format=csv,noheader,nounits",
            f"--loop-ms={self.interval_ms}",
            "-f",
            str(self.samples_file),
        ]
        try:
            self._process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        except OSError as err:
            self.unavailable = f"nvidia-smi did not start: {err}"
            self._folder.cleanup()
        return self

    @property
    def samples_file(self) -> Path:
        """Where nvidia-smi writes its lines while sampling (a temporary folder, removed once they are read)."""
        return Path(self._folder.name) / "samples.csv"

    def __exit__(self, *exc) -> None:
        if self._process is None:
            return
        self._process.terminate()
        try:
            _, errors = self._process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, errors = self._process.communicate()
        with contextlib.suppress(FileNotFoundError):
            self.samples = parse_samples(self.samples_file.read_text().splitlines())
        if self.samples.empty:
            self.unavailable = f"nvidia-smi recorded no sample ({(errors or '').strip()[:200] or 'no message'})"
        self._folder.cleanup()
        self._process = None

    def window(self, t0: float, t1: float) -> dict:
        """`summarize` of the samples taken between t0 and t1 (seconds since the epoch, `time.time()`)."""
        return self.windows([(t0, t1)])

    def windows(self, spans) -> dict:
        """`summarize` of the samples taken in any of the (t0, t1) spans."""
        keep = pd.Series(False, index=self.samples.index)
        for t0, t1 in spans:
            if t1 < t0:
                raise ValueError(f"a window ends before it starts: t0={t0}, t1={t1}")
            keep |= (self.samples.t >= t0) & (self.samples.t <= t1)
        return summarize(self.samples[keep])
