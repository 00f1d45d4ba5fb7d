"""One-off: the golden diagnosis scenarios as patches of recorded files (data, not
code), built at 8be45a2 with the tests' own helpers (keys in the order mpt wrote them).

  python tests/data/golden/make_scenarios.py   # at that commit, from the repo root
"""
import json, sys, pathlib
sys.path[:0] = ["tests", "tests/diagnose"]
import test_diagnose as td
import test_diagnose_cost as tc

def mem(total, peak):
    """A whole memory record (every field mpt writes), its parts summing to `total`."""
    m = td._memory(total, peak)
    m["estimate"].update(policy="float32", weight_copies_mb=total - 780.0,
                         input_mb_per_example=0.0, emulated_16bit=False)
    return m
def machine(run, m, **ch):
    cpu = td.isa.parse_cpuinfo((td.DATA / "cpuinfo" / f"{td.MACHINES[m][1]}.txt").read_text())
    s = json.loads((td.DATA / "runs" / run / "summary.json").read_text())
    pol = ch.get("policy", s["policy"])
    return {"hardware": {**s["hardware"], "cpu": cpu.name, "cpu_flags": sorted(k for k, v in cpu.isa().items() if v)},
            "device": f"CPU: {cpu.name} ({cpu.logical_cpus} logical cores)",
            "kernels": td.kernels_block(m, pol), **ch}
hw = lambda run: json.loads((td.DATA / "runs" / run / "summary.json").read_text())["hardware"]
ms = {"float32": 200.0, "mixed_bfloat16": 2400.0, "mixed_float16": 740.0}
S = {}
for r in ["f16_custom", "bf16_seed", "f32_fit", "f32_custom", "skips", "slow_input"]:
    S[r] = {"diagnose": f"runs/{r}"}
for r in ["64px_float32_fit_180349", "64px_mixed_bfloat16_fit_180405", "64px_mixed_float16_fit_180417"]:
    S["spr_" + r.split("_")[-3]] = {"diagnose": f"runs/spr_amx/{r}"}
S["f16_on_spr"] = {"diagnose": "runs/f16_custom", "patch": {"runs/f16_custom": machine("f16_custom", "spr"), "runs/f32_custom": machine("f32_custom", "spr")}}
S["f32_on_spr"] = {"diagnose": "runs/f32_fit", "patch": {"runs/f32_fit": machine("f32_fit", "spr")}}
S["bf16_on_zen4"] = {"diagnose": "runs/bf16_seed", "patch": {"runs/bf16_seed": machine("bf16_seed", "zen4"), "runs/f32_fit": machine("f32_fit", "zen4")}}
S["f16_zen4_flags"] = {"diagnose": "runs/f16_custom", "patch": {"runs/f16_custom": {"hardware": {**hw("f16_custom"), "cpu_flags": td.ZEN4_FLAGS}}}}
S["f16_nothing_slow"] = {"diagnose": "runs/f16_custom", "patch": {"runs/f16_custom": machine("f16_custom", "nothing_slow")}}
for g in ["tesla_p40", "tesla_t4", "a100"]:
    S[f"f16_on_{g}"] = {"diagnose": "runs/f16_custom", "patch": {"runs/f16_custom": {"hardware": td.GPU_FACTS[g]}}}
S["f32_on_a100_tf32"] = {"diagnose": "runs/f32_fit", "patch": {"runs/f32_fit": {"hardware": td.GPU_FACTS["a100"]}}}
S["f32_memory_estimate"] = {"diagnose": "runs/f32_fit", "patch": {"runs/f32_fit": {"memory": mem(1400.0, 1000.0)}}}
S["spr_f16_cost"] = {"diagnose": "runs/spr_amx/64px_mixed_float16_fit_180417",
    "patch": {"runs/spr_amx/64px_mixed_float16_fit_180417": {"kernels": tc.cost_verdict("mixed_float16", ms)}},
    "remove": ["runs/spr_amx/64px_float32_fit_180349", "runs/spr_amx/64px_mixed_bfloat16_fit_180405"]}
S["spr_f16_cost_sibling"] = {"diagnose": "runs/spr_amx/64px_mixed_float16_fit_180417",
    "patch": {"runs/spr_amx/64px_mixed_float16_fit_180417": {"kernels": tc.cost_verdict("mixed_float16", ms)}}}
S["spr_f32_onednn"] = {"diagnose": "runs/spr_amx/64px_float32_fit_180349", "patch": {"runs/spr_amx/64px_float32_fit_180349": {
    "onednn": "off", "tf_enable_onednn_opts": None, "onednn_choice": {"on": False, "env": None, "tf_default": False,
    "chosen_by": "TF's default", "why": "TF leaves it off", "measured_ms": {"on": 150.0, "off": 200.0}}}}}
S["sweep_oom"] = {"diagnose": "sweeps/oom"}
UTIL = td.UTIL
bfd = json.loads((td.DATA / "runs/bf16_seed/dtypes.json").read_text())
ops = json.loads((td.DATA / "runs/bf16_seed/op_stats.json").read_text())
S["bf16_misaligned"] = {"diagnose": "runs/bf16_seed", "patch": {"runs/bf16_seed": {"batch_size": 12, "per_replica_batch": 12},
    "runs/bf16_seed/dtypes.json": {"misaligned_flops_share": 0.2, "flops_share_32bit": 0.2}}}
S["bf16_batchnorm"] = {"diagnose": "runs/bf16_seed", "patch": {"runs/bf16_seed/op_stats.json": {"layer_time_share": {**ops["layer_time_share"], "bn1": 0.1, "bn2": 0.1, "bn3": 0.1}}}}
S["f32_low_util"] = {"diagnose": "runs/f32_fit", "patch": {"runs/f32_fit": {"util": UTIL(0.3)}}}
S["f32_shared_machine"] = {"diagnose": "runs/f32_fit", "patch": {"runs/f32_fit": {"util": UTIL(0.3, system=0.6)}}}
S["f16_scale_collapsed"] = {"diagnose": "runs/f16_custom", "patch": {"runs/f16_custom": {"loss_scale": 0.5, "skipped_steps": 10, "steps": 100}}}
S = {k: {**v, "patch": {(f if f.endswith(".json") else f + "/summary.json"): c for f, c in v.get("patch", {}).items()}} if "patch" in v else v for k, v in S.items()}
pathlib.Path("tests/data/golden/scenarios.json").write_text(json.dumps(S, indent=1) + "\n")
print(len(S))
