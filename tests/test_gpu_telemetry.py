"""The clock and power sampler (cs336_systems.benchmarking.gpu_telemetry), on CPU: nvidia-smi's lines
parsed, the sampler's subprocess run against a stand-in nvidia-smi, and no samples without a GPU."""

from __future__ import annotations

import math
import os
import stat
import sys
import time
from datetime import datetime

import pandas as pd
import pytest
import torch

from cs336_systems.benchmarking import gpu_telemetry as gt


def stamp(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]


def test_samples_are_parsed_with_local_timestamps_masks_and_missing_values():
    t = 1_795_600_000.25
    lines = [
        f"{stamp(t)}, 1590, 697.56, 55, 0x0000000000000004",
        f"{stamp(t + 0.1)}, 1620, [N/A], 56, 0x0000000000000005",
        "Failed to read something",  # not a sample
        f"{stamp(t + 0.2)}, 1605",  # a line cut when the sampler stopped
    ]
    samples = gt.parse_samples(lines)
    assert list(samples.columns) == gt.SAMPLE_COLUMNS and len(samples) == 2
    assert samples.t.tolist() == pytest.approx([t, t + 0.1], abs=1e-3)
    assert samples.sm_mhz.tolist() == [1590.0, 1620.0] and math.isnan(samples.power_w.iloc[1])
    assert samples.reasons.tolist() == [4, 5]
    assert gt.reason_names(5) == ["idle", "software power cap"]


def test_a_summary_takes_medians_the_hottest_sample_and_the_share_at_the_power_cap():
    samples = pd.DataFrame(
        dict(
            t=[1.0, 2.0, 3.0, 4.0],
            sm_mhz=[1500, 1600, 1700, 1980],
            power_w=[690, 700, 695, 300],
            temp_c=[60, 63, 61, 50],
            reasons=[4, 4, 4 | 0x20, 0],
        )
    )
    summary = gt.summarize(samples)
    assert summary == dict(sm_mhz=1650.0, power_w=692.5, temp_c=63.0, power_capped=0.75, samples=4)
    empty = gt.summarize(samples.iloc[:0])
    assert empty["samples"] == 0 and all(math.isnan(empty[k]) for k in ("sm_mhz", "power_w", "temp_c", "power_capped"))


def test_without_a_cuda_device_nothing_is_sampled_and_the_summaries_are_nan():
    with gt.GpuTelemetry("cpu") as telemetry:
        start = time.time()
    assert "no CUDA device" in telemetry.unavailable and telemetry.samples.empty
    window = telemetry.window(start, time.time())
    assert window["samples"] == 0 and math.isnan(window["sm_mhz"])
    with pytest.raises(ValueError, match="ends before it starts"):
        telemetry.window(2.0, 1.0)
    with pytest.raises(ValueError, match="interval_ms"):
        gt.GpuTelemetry("cpu", interval_ms=0)


STAND_IN = """#!{python}
# nvidia-smi's stand-in: a sample every 50 ms into the -f file, the arguments beside it, until terminated
import sys, time
from datetime import datetime
args = sys.argv[1:]
out = args[args.index("-f") + 1]
open(out + ".args", "w").write(" ".join(args))
clocks = [1500, 1600, 1700]
with open(out, "w") as f:
    for i in range(10_000):
        now = datetime.now().strftime("%Y/%m/%d %H:%M:%S.%f")[:-3]
        f.write(f"{{now}}, {{clocks[i % 3]}}, 690.5, 60, 0x{{4 if i % 2 == 0 else 0:016x}}\\n")
        f.flush()
        time.sleep(0.05)
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    """The stand-in first on PATH, a CUDA device reported, and its UUID fixed."""
    script = tmp_path / "nvidia-smi"
    script.write_text(STAND_IN.format(python=sys.executable))
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ.get('PATH', '')}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(gt.GpuTelemetry, "gpu_id", lambda self: "GPU-stand-in-uuid")


def test_the_sampler_runs_nvidia_smi_on_the_devices_uuid_and_reads_its_samples(stand_in):
    with gt.GpuTelemetry("cuda", interval_ms=50) as telemetry:
        file = telemetry.samples_file
        start = time.time()
        time.sleep(1.0)
        end = time.time()
    assert telemetry.unavailable is None and not file.exists()  # the folder is removed after reading
    assert len(telemetry.samples) >= 5 and set(telemetry.samples.sm_mhz) <= {1500.0, 1600.0, 1700.0}
    window = telemetry.window(start, end)
    assert window["samples"] >= 5 and window["power_w"] == 690.5 and 0.3 <= window["power_capped"] <= 0.7
    assert telemetry.windows([(start, start), (end + 10, end + 20)])["samples"] <= 1


def test_the_stand_in_was_given_the_query_the_interval_and_the_uuid(stand_in, monkeypatch):
    seen = {}
    original_exit = gt.GpuTelemetry.__exit__

    def keep_args(self, *exc):
        for _ in range(100):  # the stand-in writes its arguments as it starts
            if (self.samples_file.parent / "samples.csv.args").exists():
                break
            time.sleep(0.05)
        seen["args"] = (self.samples_file.parent / "samples.csv.args").read_text()
        return original_exit(self, *exc)

    monkeypatch.setattr(gt.GpuTelemetry, "__exit__", keep_args)
    with gt.GpuTelemetry("cuda", interval_ms=250):
        time.sleep(0.3)
    args = seen["args"].split()
    assert "--id=GPU-stand-in-uuid" in args and "--loop-ms=250" in args
    assert "--query-gpu=" + ",".join(gt.QUERY) in args and "--format=csv,noheader,nounits" in args


@pytest.mark.gpu
def test_the_real_nvidia_smi_samples_this_gpu_on_gpu():
    if not torch.cuda.is_available():
        pytest.skip("needs a GPU")
    x = torch.randn(4096, 4096, device="cuda")
    with gt.GpuTelemetry("cuda", interval_ms=50) as telemetry:
        start = time.time()
        while time.time() - start < 1.0:
            x = x @ x.T / 64.0
        torch.cuda.synchronize()
        end = time.time()
    assert telemetry.unavailable is None, telemetry.unavailable
    window = telemetry.window(start, end)
    assert window["samples"] >= 5 and 100 < window["sm_mhz"] < 5000 and window["power_w"] > 10
