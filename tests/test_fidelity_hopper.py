"""benchmarks/fidelity_hopper.py: rows map to the layouts and clusters their sources
publish, refused and skipped rows stay on the page, and a tiny row simulates end to end.
Fast checks only (the benchmark itself is run by hand)."""
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import fidelity_hopper as fh  # noqa: E402  (benchmarks/ is scripts, not a package)
import fidelity_hopper_data as hd  # noqa: E402

from clustersim.sim.cost_model import RooflineCostModel  # noqa: E402

ROWS = {fh.row_id(r): r for r in hd.PUBLISHED_RUNS}


def test_every_row_has_a_topology_with_enough_gpus_of_the_right_kind():
    for run in hd.PUBLISHED_RUNS:
        name, spec, device = fh.topology_for(run)
        if spec is None:
            size = fh.PRESET_SIZES.get(name, 8)
        else:
            size = spec["params"]["num_nodes"] * 8
            assert "(built)" in name or "built" in name
        assert size >= run.gpus, fh.row_id(run)
        gpu = {"B200": "B200", "H200": "H200"}.get(run.cluster.gpu[:4], "H100")
        assert gpu in device, fh.row_id(run)


def test_mlm_row_maps_to_megatron_defaults_and_its_overlaps():
    run = ROWS["MLM:70B"]
    p = fh.parallel_config(run)
    assert (p.tp, p.pp, p.cp, p.ep, p.dp, p.vpp) == (8, 2, 1, 1, 48, 1)
    assert (p.micro_batch_size, p.global_batch_size, p.num_microbatches) == (1, 384, 8)
    assert p.sequence_parallel and p.tp_comm_overlap and p.recompute == "none"
    assert p.zero_stage == 1 and p.overlap_grad_reduce and p.overlap_param_gather
    m = fh.model_spec(run)
    assert (m.num_layers, m.hidden_size, m.seq_length, m.vocab_size, m.dtype) == \
        (84, 8192, 4096, 131072, "bf16")
    assert fh.topology_for(run)[0] == "dgx-superpod-h100-4su"


def test_nemo_row_keeps_its_printed_cp_vp_mbs_and_fp8():
    run = ROWS["NEMO2407:LLAMA3-70B"]
    p = fh.parallel_config(run)
    assert (p.tp, p.pp, p.cp, p.dp, p.vpp, p.micro_batch_size, p.global_batch_size) == \
        (4, 4, 2, 2, 5, 1, 128)
    assert p.schedule == "interleaved-1f1b" and p.num_microbatches == 64
    assert fh.model_spec(run).dtype == "fp8" and fh.model_spec(run).seq_length == 8192


def test_llama3_and_titan_rows_shard_as_published():
    llama = fh.parallel_config(ROWS["LLAMA3:16K GPUs, 128K seq"])
    assert (llama.tp, llama.cp, llama.pp, llama.dp) == (8, 16, 16, 8)
    assert llama.zero_stage == 3 and llama.fsdp == "full" and not llama.reshard_after_forward
    assert llama.account_for_embedding and llama.account_for_loss  # 126 layers + 2 slots
    assert fh.topology_for(ROWS["LLAMA3:16K GPUs, 128K seq"])[0] == "llama3-24k-roce"
    titan = ROWS["TITAN:405B 3D 1F1B"]
    p = fh.parallel_config(titan)
    assert (p.micro_batch_size, p.num_microbatches, p.global_batch_size) == (4, 8, 256)
    assert p.tp_comm_overlap and p.recompute == "full" and fh.model_spec(titan).dtype == "fp8"
    mosaic = fh.parallel_config(ROWS["MOSAIC:mpt-3b 8 amp_fp8"])
    assert (mosaic.dp, mosaic.micro_batch_size, mosaic.num_microbatches) == (8, 10, 6)
    assert mosaic.fsdp == "full" and mosaic.recompute == "none"


def _tiny_run() -> hd.HopperRun:
    """A row shaped like a NeMo one (TP 2 with SP, PP 2, distributed optimizer, FP8) on a
    2-layer model that simulates in well under a second."""
    tiny = hd.Model("tiny", 2, 512, 2048, 8, 8, 1024, True, "test")
    return replace(ROWS["NEMO2407:LLAMA2-7B"], label="tiny", model=tiny, gpus=8, tp=2, pp=2,
                   dp=2, seq_length=256, global_batch_size=8, micro_batch_size=1, vpp=1,
                   tokens_per_s_per_gpu=1000.0)


def test_tiny_row_simulates_end_to_end_and_renders():
    run = _tiny_run()
    rows = fh.run_rows((run,), RooflineCostModel(), row_limit=30,
                       deadline=time.monotonic() + 30)
    (row,) = rows
    assert row["status"] == "ok", row.get("reason")
    assert row["predicted_s"] > 0
    assert row["error"] == pytest.approx(row["published_s"] / row["predicted_s"] - 1)
    assert row["topology"] == "dgx-h100"
    data = {"environment": {"date": "today"}, "simulator": {"commit": "abc", "source_sha256": "0",
                                                            "changed_files": []},
            "command": "test", "attainment": 0.9, "rows": rows, "summary": fh.summary(rows),
            "total_wall_s": 0.0}
    page = fh.render(data)
    assert "NEMO2407 | tiny | 8 |" in page and "within 10%" in page


def test_refused_and_skipped_rows_are_reported_not_dropped():
    refused = replace(_tiny_run(), label="refused", gpus=8, tp=3, dp=2, pp=1)  # 8 % 3 heads
    skipped = replace(_tiny_run(), label="skipped")
    rows = fh.run_rows((refused, skipped), RooflineCostModel(), row_limit=30,
                       deadline=time.monotonic() + 30)
    assert rows[0]["status"] == "refused" and "ConfigError" in rows[0]["reason"]
    over = fh.run_rows((skipped,), RooflineCostModel(), row_limit=30,
                       deadline=time.monotonic() - 1)
    assert over[0]["status"] == "skipped" and "budget" in over[0]["reason"]
    rows = [rows[0], over[0]]
    s = fh.summary(rows)
    assert (s["rows"], s["simulated"], s["refused"], s["skipped"]) == (2, 0, 1, 1)
    page = fh.render({"environment": {}, "simulator": {"commit": "abc", "source_sha256": "0",
                                                       "changed_files": []},
                      "command": "test", "attainment": 0.9, "rows": rows, "summary": s,
                      "total_wall_s": 0.0})
    assert "**REFUSED**: ConfigError" in page and "**SKIPPED**: the total time budget" in page


def test_row_over_its_time_limit_is_skipped():
    row = fh.run_with_limit(_tiny_run(), fh.build_topology("dgx-h100", None),
                            RooflineCostModel(), limit_s=0.0)
    assert row["status"] == "skipped" and "row limit" in row["reason"]
