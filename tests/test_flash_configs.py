"""Launch configurations of the Triton FlashAttention kernels: table, lookup, per-kernel use."""

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402

from cs336_systems.attention import configs as flash_configs  # noqa: E402
from cs336_systems.attention.configs import (  # noqa: E402
    ConfigTable,
    KernelConfig,
    ProblemKey,
    candidate_configs,
    config_for,
    default_config,
    seq_bucket,
)


@pytest.fixture
def user_cache(tmp_path, monkeypatch):
    path = tmp_path / "flash_configs.json"
    monkeypatch.setenv("CS336_FLASH_CONFIGS", str(path))
    flash_configs.reload_config_table()
    yield path
    monkeypatch.delenv("CS336_FLASH_CONFIGS")
    flash_configs.reload_config_table()


def test_kernel_config_rejects_bad_values():
    with pytest.raises(ValueError, match="q_tile must be a power of two"):
        KernelConfig(24, 16, 4, 2)
    with pytest.raises(ValueError, match="k_tile must be a power of two >= 16"):
        KernelConfig(16, 8, 4, 2)
    with pytest.raises(ValueError, match="num_warps"):
        KernelConfig(16, 16, 3, 2)
    with pytest.raises(ValueError, match="num_stages"):
        KernelConfig(16, 16, 4, 0)


def test_problem_key_round_trip_and_buckets():
    key = ProblemKey.of("dkdv", 64, torch.bfloat16, True, 1000, 3000)
    assert key == ProblemKey("dkdv", 64, "bfloat16", True, 4096)
    assert ProblemKey.from_str(key.to_str()) == key
    assert key.to_str() == "dkdv|d64|bfloat16|causal|n4096"
    assert [seq_bucket(n) for n in (1, 16, 17, 128, 129, 16384)] == [16, 16, 32, 128, 256, 16384]
    with pytest.raises(ValueError, match="unknown kernel 'backward'"):
        ProblemKey.of("backward", 64, torch.float32, False, 8, 8)


def test_candidates_start_with_the_default_and_shrink_for_large_tiles():
    for kernel in flash_configs.KERNELS:
        for d_tile, size in ((64, 2), (128, 2), (128, 4), (256, 2)):
            configs = candidate_configs(kernel, d_tile, size)
            assert configs[0] == default_config(kernel, d_tile, size)
            assert len(set(configs)) == len(configs)
    assert len(candidate_configs("forward", 64, 2)) > len(candidate_configs("forward", 256, 2))
    assert all(c.q_tile * c.k_tile <= 64 * 64 for c in candidate_configs("dq", 256, 2))


def test_table_store_merges_and_lookup_falls_back_to_nearest_length(tmp_path):
    path = tmp_path / "table.json"
    table = ConfigTable([path])
    fast, slow = KernelConfig(128, 64, 8, 3), KernelConfig(64, 32, 4, 2)
    table.store("GPU A", ProblemKey("forward", 64, "bfloat16", True, 16384), fast, path)
    table.store("GPU A", ProblemKey("forward", 64, "bfloat16", True, 1024), slow, path)
    table.store("GPU B", ProblemKey("dq", 64, "bfloat16", True, 1024), slow, path)
    reread = ConfigTable([path])
    assert set(json.loads(path.read_text())) == {"GPU A", "GPU B"}
    assert reread.lookup("GPU A", ProblemKey("forward", 64, "bfloat16", True, 16384)) == fast
    assert reread.lookup("GPU A", ProblemKey("forward", 64, "bfloat16", True, 8192)) == fast
    assert reread.lookup("GPU A", ProblemKey("forward", 64, "bfloat16", True, 2048)) == slow
    assert reread.lookup("GPU A", ProblemKey("forward", 64, "bfloat16", False, 16384)) is None
    assert reread.lookup("GPU A", ProblemKey("forward", 128, "bfloat16", True, 16384)) is None
    assert reread.lookup("GPU C", ProblemKey("forward", 64, "bfloat16", True, 16384)) is None


def test_a_gpu_with_another_gpus_sms_takes_its_entries_where_its_own_table_has_none(tmp_path):
    """The H200 (the H100's chip with more memory) untuned takes the shipped H100 entries, not the default;
    an entry of its own for the same problem wins; a GPU not in SAME_SMS takes nothing from another's table."""
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    assert flash_configs.SAME_SMS[h200] == h100
    shipped = ConfigTable([flash_configs.SHIPPED_TABLE])
    small = ProblemKey.of("forward", 128, torch.bfloat16, True, 8192, 8192, small_grid=True)
    assert shipped.lookup(h100, small) is not None
    assert shipped.lookup(h200, small) == shipped.lookup(h100, small)
    assert shipped.lookup("NVIDIA A100-SXM4-80GB", small) is None

    path = tmp_path / "table.json"
    table = ConfigTable([path])
    theirs, own = KernelConfig(64, 128, 4, 3), KernelConfig(128, 64, 8, 2)
    table.store(h100, ProblemKey("forward", 128, "bfloat16", True, 8192), theirs, path)
    table.store(h100, ProblemKey("dq", 128, "bfloat16", True, 8192), theirs, path)
    table.store(h200, ProblemKey("forward", 128, "bfloat16", True, 16384), own, path)
    # its own entry at the nearest length for a problem it has tuned; the H100's for one it has not
    assert table.lookup(h200, ProblemKey("forward", 128, "bfloat16", True, 8192)) == own
    assert table.lookup(h200, ProblemKey("dq", 128, "bfloat16", True, 8192)) == theirs
    assert table.lookup(h100, ProblemKey("forward", 128, "bfloat16", True, 16384)) == theirs


def test_small_grid_keys_round_trip_and_are_preferred_in_their_class(tmp_path):
    """A latency-bound (small-grid) launch takes the small-grid entries, at the nearest length among
    them; a full grid never takes them while full-grid entries exist; either class falls back to
    the other where it has no entry."""
    small = ProblemKey.of("forward", 128, torch.bfloat16, True, 2000, 2000, small_grid=True)
    assert small.to_str() == "forward|d128|bfloat16|causal|n2048|small-grid"
    assert ProblemKey.from_str(small.to_str()) == small
    with pytest.raises(ValueError, match="unknown grid class 'huge'"):
        ProblemKey.from_str("forward|d128|bfloat16|causal|n2048|huge")
    path = tmp_path / "table.json"
    table = ConfigTable([path])
    full_config, small_config = KernelConfig(128, 128, 8, 3), KernelConfig(64, 128, 4, 3)
    table.store("GPU", ProblemKey("forward", 128, "bfloat16", True, 16384), full_config, path)
    table.store("GPU", ProblemKey("forward", 128, "bfloat16", True, 1024, True), small_config, path)
    reread = ConfigTable([path])
    assert reread.lookup("GPU", ProblemKey("forward", 128, "bfloat16", True, 8192, True)) == small_config
    assert reread.lookup("GPU", ProblemKey("forward", 128, "bfloat16", True, 1024, False)) == full_config
    table.store("GPU", ProblemKey("dq", 128, "bfloat16", True, 16384), full_config, path)
    table.store("GPU", ProblemKey("dkdv", 128, "bfloat16", True, 1024, True), small_config, path)
    assert table.lookup("GPU", ProblemKey("dq", 128, "bfloat16", True, 1024, True)) == full_config
    assert table.lookup("GPU", ProblemKey("dkdv", 128, "bfloat16", True, 16384, False)) == small_config


def test_a_grid_is_small_below_one_64_row_program_per_sm():
    from cs336_systems.attention.heuristics import is_small_grid

    # 132 SMs (an H100): one head at N = 8,192 has 128 query tiles of 64 rows, at 8,448 it has 132
    assert is_small_grid("forward", 1, 8192, 8192, 132)
    assert not is_small_grid("forward", 1, 8448, 8448, 132)
    assert not is_small_grid("forward", 16, 1024, 1024, 132)
    assert is_small_grid("forward", 2, 4097, 4097, 132)  # 65 tiles each
    # dK/dV's programs walk the keys
    assert is_small_grid("dkdv", 1, 16384, 1024, 132) and not is_small_grid("dq", 1, 16384, 1024, 132)
    assert not is_small_grid("forward", 1, 128, 128, 0)  # no SMs counted: off CUDA


def test_kv_split_chunk_spreads_the_work_over_the_sms():
    from cs336_systems.attention.heuristics import kv_split_chunk

    # One head, causal, 64x128 tiles, 132 SMs: N = 4,096 has 64 query tiles holding 1 to 32 key tiles,
    # 1,056 in all: 6 tiles per chunk at 4/3 programs per SM (d = 64), 12 at 2/3 (d = 128).
    assert kv_split_chunk(1, 4096, 4096, True, 64, 128, 64, 132) == 6 * 128
    assert kv_split_chunk(1, 4096, 4096, True, 64, 128, 128, 132) == 12 * 128
    assert kv_split_chunk(1, 1024, 1024, True, 64, 128, 64, 132) == 2 * 128, "at least MIN_SPLIT_TILES"
    # without the mask every query tile holds all 8 key tiles: 128 in all, the floor of 2 per chunk
    assert kv_split_chunk(1, 1024, 1024, False, 64, 128, 64, 132) == 2 * 128
    # N_q < N_k: query tile i sees its (i + 1)·64 keys, as at N_k = N_q: 16 tiles of 1-8 key tiles, 72 in all
    assert kv_split_chunk(1, 1024, 4096, True, 64, 128, 64, 132) == 2 * 128
    # N_q > N_k: the query tiles past N_k see all 8 key tiles: 72 + 48·8 = 456 in all
    assert kv_split_chunk(1, 4096, 1024, True, 64, 128, 64, 132) == 3 * 128
    assert kv_split_chunk(1, 8192, 8192, True, 64, 128, 128, 132) is None, "chunks of 48 would keep most of 64 tiles"
    assert kv_split_chunk(8, 1024, 1024, True, 64, 128, 64, 132) is None, "chunks of 4 would keep half of 8 tiles"
    assert kv_split_chunk(3, 4096, 4096, True, 64, 128, 64, 132) is None, "192 programs fill 132 SMs"
    assert kv_split_chunk(1, 1024, 1024, True, 64, 128, 64, 0) is None, "no SMs counted: off CUDA"


def test_config_for_takes_the_small_grid_entry_by_batch(user_cache, monkeypatch):
    cpu = torch.device("cpu")
    table = flash_configs.config_table()
    table.store(
        "cpu", ProblemKey.of("forward", 64, torch.bfloat16, True, 1024, 1024), KernelConfig(128, 64, 8, 3), user_cache
    )
    table.store(
        "cpu",
        ProblemKey.of("forward", 64, torch.bfloat16, True, 1024, 1024, small_grid=True),
        KernelConfig(64, 128, 4, 3),
        user_cache,
    )
    monkeypatch.setattr(flash_configs, "sm_count", lambda device: 132)
    assert config_for("forward", 64, torch.bfloat16, True, 1024, 1024, cpu, batch=1) == KernelConfig(64, 128, 4, 3)
    assert config_for("forward", 64, torch.bfloat16, True, 1024, 1024, cpu, batch=16) == KernelConfig(128, 64, 8, 3)
    assert config_for("forward", 64, torch.bfloat16, True, 1024, 1024, cpu) == KernelConfig(128, 64, 8, 3)


def test_later_files_win(tmp_path):
    shipped, user = tmp_path / "shipped.json", tmp_path / "user.json"
    key = ProblemKey("forward", 64, "bfloat16", True, 1024)
    ConfigTable([shipped]).store("GPU", key, KernelConfig(64, 64, 4, 2), shipped)
    ConfigTable([user]).store("GPU", key, KernelConfig(128, 64, 8, 3), user)
    assert ConfigTable([shipped, user]).lookup("GPU", key) == KernelConfig(128, 64, 8, 3)


def test_config_for_reads_the_user_cache(user_cache):
    cpu = torch.device("cpu")
    assert config_for("forward", 16, torch.float32, True, 40, 40, cpu) == default_config("forward", 16, 4)
    ConfigTable([user_cache]).store(
        "cpu", ProblemKey.of("forward", 16, torch.float32, True, 40, 40), KernelConfig(32, 16, 4, 1), user_cache
    )
    flash_configs.reload_config_table()
    assert config_for("forward", 16, torch.float32, True, 40, 40, cpu) == KernelConfig(32, 16, 4, 1)
    # lookups are cached; a configuration stored in the live table (as the tuner does) still wins at once
    flash_configs.config_table().store(
        "cpu", ProblemKey.of("forward", 16, torch.float32, True, 40, 40), KernelConfig(16, 16, 2, 1), user_cache
    )
    assert config_for("forward", 16, torch.float32, True, 40, 40, cpu) == KernelConfig(16, 16, 2, 1)


def test_config_for_gives_each_length_its_bucket_and_each_batch_its_grid_class(user_cache, monkeypatch):
    """The longer of the two lengths picks the bucket (the power of two at or above it); a batch whose grid
    is smaller than the GPU's SMs takes the small-grid entry of that bucket."""
    cpu = torch.device("cpu")
    monkeypatch.setattr(flash_configs, "sm_count", lambda device: 8)  # small grid: batch·ceil(N_q / 64) < 8
    table = flash_configs.config_table()
    table.store("cpu", ProblemKey("forward", 64, "bfloat16", True, 128), KernelConfig(16, 32, 2, 1), user_cache)
    table.store("cpu", ProblemKey("forward", 64, "bfloat16", True, 4096), KernelConfig(64, 16, 8, 3), user_cache)
    table.store("cpu", ProblemKey("forward", 64, "bfloat16", True, 128, True), KernelConfig(32, 32, 4, 2), user_cache)
    for n_q, n_k, batch, expected in [
        (100, 100, 4, (16, 32, 2, 1)),
        (120, 90, 4, (16, 32, 2, 1)),
        (3000, 3000, 4, (64, 16, 8, 3)),
        (100, 4000, 4, (64, 16, 8, 3)),
        (110, 70, 4, (16, 32, 2, 1)),
        (110, 70, 3, (32, 32, 4, 2)),
        (100, 4000, 1, (32, 32, 4, 2)),
    ]:
        config = config_for("forward", 64, torch.bfloat16, True, n_q, n_k, cpu, batch)
        assert (config.q_tile, config.k_tile, config.num_warps, config.num_stages) == expected, (n_q, n_k, batch)


def test_each_kernel_runs_its_own_configuration(user_cache):
    """Forward, dK/dV and dQ with three different tile shapes still give the float64 answer."""
    from cs336_systems.attention.api import DEFAULTS, FlashAttentionTriton
    from cs336_systems.attention.configs import kernel_configs
    from cs336_systems.attention.launch.layout import kernels_interpreted
    from cs336_systems.attention.validation import Problem
    from test_flash_attention import check_against_reference

    if not torch.cuda.is_available() and not kernels_interpreted():
        pytest.skip("triton was imported before TRITON_INTERPRET=1 could be set, and there is no GPU")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = flash_configs.device_name(torch.device(device))
    chosen = {
        "forward": KernelConfig(32, 16, 4, 1),
        "dkdv": KernelConfig(16, 32, 4, 1),
        "dq": KernelConfig(16, 16, 4, 1),
    }
    for kernel, config in chosen.items():
        ConfigTable([user_cache]).store(
            name, ProblemKey.of(kernel, 16, torch.float32, True, 45, 45), config, user_cache
        )
    flash_configs.reload_config_table()
    assert DEFAULTS.tiles is None
    q = torch.zeros(1, 45, 16, device=device)
    for kernel, config in chosen.items():
        assert getattr(kernel_configs(Problem.of(q, q, True)), kernel) == config
    check_against_reference(FlashAttentionTriton.apply, (1, 45, 16), (1, 45, 16), torch.float32, True, device)


def test_tuning_needs_a_gpu():
    from cs336_systems.attention.tuning import tune_flash_attention

    with pytest.raises(ValueError, match="tuning needs a CUDA device, got cpu"):
        tune_flash_attention(64, head_dim=16, device="cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_tuning_on_gpu_stores_the_fastest_correct_config(user_cache):
    from cs336_systems.attention.tuning import tune_flash_attention, tuning_summary

    df = tune_flash_attention(256, head_dim=32, batch=2, kernels=["forward", "dq"], rep_ms=5, progress=False)
    assert set(df.kernel) == {"forward", "dq"} and df.best.sum() == 2
    ok = df[df.status == "ok"]
    name = torch.cuda.get_device_name()
    for kernel, group in ok.groupby("kernel"):
        best = group.loc[group.ms.idxmin()]
        stored = ConfigTable([user_cache]).lookup(name, ProblemKey.of(kernel, 32, torch.bfloat16, True, 256, 256))
        assert stored == KernelConfig(int(best.q_tile), int(best.k_tile), int(best.num_warps), int(best.num_stages))
    assert len(tuning_summary(df)) == 2


def test_tuning_in_a_fresh_process_is_held_to_its_budget(tmp_path):
    from cs336_systems.attention.tuning import tune_in_fresh_process

    with pytest.raises(RuntimeError, match=r"did not finish within 0.01 s"):
        tune_in_fresh_process(1024, 64, "bfloat16", out_dir=tmp_path, timeout_s=0.01)


@pytest.mark.parametrize("kernel", ["forward", "dkdv", "dq"])
def test_the_shipped_h100_table_tunes_head_dim_128_with_and_without_the_mask(kernel):
    """Each d = 128 bf16 kernel has tuned entries on the H100 for causal and full attention, in both grid
    classes, so that no such problem falls back to `default_config`, which is far slower there
    (docs/measurements_record.md)."""
    table = ConfigTable([flash_configs.SHIPPED_TABLE])
    keys = table.entries["NVIDIA H100 80GB HBM3"]
    for is_causal in (True, False):
        for small_grid in (True, False):
            found = [
                k
                for k in keys
                if (k.kernel, k.head_dim_tile, k.dtype, k.is_causal, k.small_grid)
                == (kernel, 128, "bfloat16", is_causal, small_grid)
            ]
            assert found, (
                f"no {kernel} d=128 bf16 {'causal' if is_causal else 'full'} entry for "
                f"{'small' if small_grid else 'full'} grids"
            )
