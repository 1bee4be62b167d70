"""Which model on which GPU a config is priced for (``labkit.memory.model_source``, ``labkit.memory.choice``) and
the headroom a real GPU lacks (``labkit.memory.headroom``): the model from ``actor_rollout_ref.model.path`` (never a
silent tiny default; the CLI and the dashboard decide alike), capacity as nvidia-smi reports it, the named
overhead terms, fits / tight / OOM with the margin, and the verdict's length assumption."""

import contextlib
import io
import json
from dataclasses import asdict, replace

import pytest
from _known_configs import GRPO_7B_8K

from labkit.cli import main
from labkit.config.messages import ConfigError
from labkit.config.verl_config import load_config
from labkit.memory.choice import settings_for
from labkit.memory.data_tables import DATA
from labkit.memory.headroom import reported_bytes, state
from labkit.memory.model_catalogue import model_shape
from labkit.memory.model_source import model_for, shape_from_config_json
from labkit.memory.verdict import memory_report
from labkit.ui import dashboard_state as S

GiB, MiB = 2**30, 2**20
PATH = "actor_rollout_ref.model.path"
USER = GRPO_7B_8K


def _cli(*args):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["memory", *args])
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    "path", ["Qwen/Qwen2.5-7B-Instruct", "/home/me/models/Qwen2.5-7B-Instruct/", "hdfs://x/Qwen2.5-7B-Instruct"]
)
def test_a_known_hf_name_or_its_basename_picks_the_shape(path):
    cfg = load_config(None, [f"{PATH}={path}"])
    assert model_for(cfg) == model_shape("Qwen2.5-7B")
    code, out, _ = _cli(*USER, f"{PATH}={path}", "--json")
    assert code == 1 and json.loads(out)["first_oom"] == "old_log_prob"  # the 7B OOMs; the tiny model never would


def test_a_local_folder_is_read_for_its_shape(tmp_path):
    config = json.loads((DATA / "tiny-qwen2" / "config.json").read_text())
    config.update(hidden_size=512, num_hidden_layers=5, vocab_size=1000, tie_word_embeddings=False)
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    shape = model_for(load_config(None, [f"{PATH}={folder}"]))
    assert (shape.name, shape.hidden_size, shape.num_hidden_layers, shape.vocab_size) == ("my-model", 512, 5, 1000)
    assert not shape.tie_word_embeddings and shape.attention_bias and shape.head_dim == 512 // 4
    tiny = shape_from_config_json(DATA / "tiny-qwen2")  # the shipped folder reads as the shipped shape
    same = {k: v for k, v in asdict(model_shape("tiny-qwen2")).items() if k not in ("name", "published_params")}
    assert {k: v for k, v in asdict(tiny).items() if k in same and k != "source"} == {
        k: v for k, v in same.items() if k != "source"
    }
    config["model_type"] = "gpt2"
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="--model"):
        model_for(load_config(None, [f"{PATH}={folder}"]))


def test_anything_else_exits_2_asking_for_model_and_the_dashboard_agrees():
    code, out, err = _cli(f"{PATH}=my-org/my-model")
    assert code == 2 and not out and "--model" in err and "my-org/my-model" in err and "Traceback" not in err
    assert err.count("\n") == 1
    code, out, _ = _cli(f"{PATH}=my-org/my-model", "--model", "Qwen2.5-0.5B", "--json")
    assert code in (0, 1) and json.loads(out)["phases"]
    text = " ".join([f"{PATH}=my-org/my-model", *USER])
    unknown = S.evaluate(S.Inputs(text))
    assert unknown.memory is None and "--model" in (unknown.memory_error or "")
    for path in ("Qwen/Qwen2.5-7B-Instruct", "data/tiny-qwen2"):  # the same model on both sides
        st = S.evaluate(S.Inputs(" ".join([f"{PATH}={path}", *USER]), lengths=S.NO_LENGTHS))
        code, out, _ = _cli(*USER, f"{PATH}={path}", "--json")
        assert st.model_name == model_for(load_config(None, [f"{PATH}={path}"])).name
        assert {n: p.peak_bytes for n, p in st.memory.phases.items()} == {
            n: p["peak_bytes"] for n, p in json.loads(out)["phases"].items()
        }


def test_capacity_is_what_the_gpu_reports_and_headroom_terms_are_named():
    cfg = load_config(None, USER)
    s = settings_for(cfg, "Qwen2.5-7B", "H100-80GB")
    assert s.gpu_bytes == reported_bytes("H100-80GB")[0] == 81559 * MiB < 80 * GiB
    assert s.cuda_context_bytes > 0 and s.cublas_workspace_bytes == 32 * MiB and s.nccl_bytes > 0
    one = load_config(None, ["trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.tensor_model_parallel_size=1"])
    assert settings_for(one, "Qwen2.5-7B").nccl_bytes == 0
    assert settings_for(cfg, "Qwen2.5-7B", "A100-80GB").cublas_workspace_bytes < 32 * MiB
    rep = memory_report(cfg, s)
    bare = memory_report(cfg, replace(s, cuda_context_bytes=0, cublas_workspace_bytes=0, nccl_bytes=0))
    for name, p in rep.phases.items():
        live = p.instants[p.peak_instant]
        assert {"cuda_context", "cublas_workspace", "nccl_buffers", "allocator_reserve"} <= set(live), name
        if name != "generate":  # the context, cuBLAS and NCCL come on top of what the passes allocate
            fixed = s.cuda_context_bytes + s.cublas_workspace_bytes + s.nccl_bytes
            assert p.peak_bytes == bare.phases[name].peak_bytes + fixed, name
            alloc = sum(v for k, v in live.items() if k != "allocator_reserve") - fixed
            assert live["allocator_reserve"] == int(s.reserve_fraction * alloc) > 0
    gen, gen_bare = rep.phases["generate"].instants["engine"], bare.phases["generate"].instants["engine"]
    assert sum(gen.values()) == sum(gen_bare.values())  # the engine's u·C already holds its process overhead
    assert gen["kv_cache"] < gen_bare["kv_cache"]


def test_fits_tight_oom_with_the_margin():
    cfg = load_config(None, USER)
    s = settings_for(cfg, "Qwen2.5-7B", margin_gib=2)
    assert state(s, s.gpu_bytes - 3 * GiB) == ("fits", 3 * GiB)
    assert state(s, s.gpu_bytes - GiB // 3) == ("tight", GiB // 3)  # 0.3 GiB left is never "fits"
    assert state(s, s.gpu_bytes + 1) == ("OOM", -1)
    peak = memory_report(cfg, s).phases["old_log_prob"].peak_bytes  # does not depend on C (the engine sleeps)
    over = [*USER, "--model", "Qwen2.5-7B", "--gpu-memory", str(peak + GiB)]  # a GPU 1 GiB larger than the peak
    code, out, _ = _cli(*over)
    assert code == 0 and "verdict: tight" in out and "old_log_prob leaves 1.00 GiB" in out and "fixes" in out
    code, out, _ = _cli(*over, "--margin", "0.5")
    assert code == 0 and "verdict: every phase fits, at least 1.00 GiB left" in out
    code, out, _ = _cli(*USER, "--model", "Qwen2.5-7B", "--gpu-memory", str(peak - 1))
    assert code == 1 and "old_log_prob is the first phase that OOMs" in out
    code, _, err = _cli(*over, "--margin", "-1")
    assert code == 2 and "--margin" in err


def test_the_verdict_states_its_length_assumption_and_the_typical_case():
    cfg = load_config(None, [*USER, "actor_rollout_ref.actor.use_dynamic_bsz=false"])
    s = settings_for(cfg, "Qwen2.5-7B")
    worst = memory_report(cfg, s)
    real = memory_report(cfg, s, "gsm8k-like")
    assert "full width" in worst.lengths and "gsm8k-like" in real.lengths and "typical" in real.lengths
    old = real.phases["old_log_prob"]
    assert old.info["typical_tokens"] <= old.info["tokens"] < worst.phases["old_log_prob"].info["tokens"]
    assert old.info["typical_peak_bytes"] <= old.peak_bytes < worst.phases["old_log_prob"].peak_bytes
    st = S.evaluate(S.Inputs(" ".join([f"{PATH}=Qwen/Qwen2.5-7B-Instruct", *USER]), lengths="gsm8k-like"))
    flat = S.evaluate(S.Inputs(" ".join([f"{PATH}=Qwen/Qwen2.5-7B-Instruct", *USER]), lengths=S.NO_LENGTHS))
    assert "gsm8k-like" in st.memory.lengths and "full width" in flat.memory.lengths
    assert st.memory.phases["old_log_prob"].peak_bytes < flat.memory.phases["old_log_prob"].peak_bytes


def test_eager_entropy_costs_fp32_and_torch_compile_is_offered():
    """actor.use_torch_compile=false: the entropy's softmax and product are fp32 under autocast (8 bytes a logit,
    as the fake-CUDA trace holds them); verl's default, torch.compile, fuses them (three (T, 1) statistics and the
    result: 16 bytes a token); the fixes then offer torch.compile back."""
    eager = load_config(None, USER)
    default = load_config(None, [*USER, "actor_rollout_ref.actor.fsdp_config.use_torch_compile=true"])
    se, sd = settings_for(eager, "Qwen2.5-7B"), settings_for(default, "Qwen2.5-7B")
    assert sd.entropy_compiled and not se.entropy_compiled
    re, rd = memory_report(eager, se), memory_report(default, sd)
    tokens = re.phases["old_log_prob"].info["tokens"]
    e_terms, d_terms = re.phases["old_log_prob"].instants["entropy"], rd.phases["old_log_prob"].instants["entropy"]
    assert e_terms["entropy"] == 8 * tokens * 152064 and d_terms["entropy"] == 16 * tokens
    knobs = {f["knob"]: f for f in re.fixes}
    assert "actor_rollout_ref.actor.fsdp_config.use_torch_compile" in knobs
    assert "actor_rollout_ref.actor.fsdp_config.use_torch_compile" not in {f["knob"] for f in rd.fixes}
    fix = knobs["actor_rollout_ref.actor.fsdp_config.use_torch_compile"]
    assert fix["new_peak_bytes"] == rd.phases["old_log_prob"].peak_bytes
