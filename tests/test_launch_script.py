"""``labkit read`` against bash itself: verl's own launch scripts (tests/data/launch_scripts) run by real bash in a
scratch HOME and cwd, with stub ``python3``/``uv``/``torchrun``/``ray``/... first on PATH that record their argv;
what bash passed after the entry point is the truth. Each script is read exactly, or refused naming its line and
construct; none is misread. Plus small scripts per construct, against the same oracle. (Only the test runs bash.)"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from labkit.config.bash_expand import Val
from labkit.config.launch_script import MAX_SCRIPT_BYTES, LaunchError, find_entry, read_script

DATA = Path(__file__).parent / "data" / "launch_scripts"
SETS = sorted(p.name for p in DATA.glob("verl-*"))
BASH = shutil.which("bash")
STUBS = ("python3", "python", "uv", "torchrun", "ray", "nvidia-smi", "npu-smi", "hf", "huggingface-cli", "pip",
         "pip3", "wget", "curl", "git", "srun", "sbatch", "scontrol", "sleep")  # fmt: skip
STUB = """#!/bin/bash
printf '%s\\0' "${0##*/}" "$@" > "$STUB_LOG/${EPOCHREALTIME/./}"
case "${0##*/}" in python*) [ "$1" = -c ] && exit 1;; esac
exit 0
"""  # python3 -c 'import torch_npu' fails: a GPU machine
USER_ENV = {"MODEL_PATH": "/models/Qwen2.5-7B-Instruct", "DATA_PATH": "/data", "HDFS_ROOT": "/hdfs",
            "RAY_DATA_HOME": "/ray", "WORK_DIR": "/work", "LORA_ADAPTER_PATH": "/adapter", "NNODES": "2",
            "NGPUS_PER_NODE": "4", "INFER_BACKEND": "vllm"}  # fmt: skip
USER_ARGS = ("trainer.total_epochs=3", "+extra.key='a b'")
ASSUMED = {"DEVICE": "gpu"}  # what the stub python3 makes $(python3 -c 'import torch_npu' ... || echo gpu) print
TIMEOUT = ["<bash timed out>"]  # a loaded machine: neither a reading nor a misreading
pytestmark = pytest.mark.skipif(BASH is None, reason="needs bash")


def _scratch(root: Path) -> dict[str, str]:
    stubs = root / ".stubs"
    (stubs / "bin").mkdir(parents=True)
    (stubs / "log").mkdir()
    for name in STUBS:
        stub = stubs / "bin" / name
        stub.write_text(STUB)
        stub.chmod(0o755)
    return {"HOME": str(root), "PATH": f"{stubs / 'bin'}:/usr/bin:/bin", "STUB_LOG": str(stubs / "log")}


def bash_truth(text: str, root: Path, env: dict[str, str], args: tuple[str, ...] = ()) -> list[str] | None:
    """What real bash passes after verl's entry point (None: it launches nothing), in a scratch cwd."""
    script = root / "script.sh"
    script.write_text(text)
    full = {**env, "BASH_FUNC_ulimit%%": "() { return 0; }"}  # ulimit -n fails in a container, not on a GPU host
    for _ in range(3):  # a stub written while another thread forks can be busy for exec (ETXTBSY): run it again
        try:
            done = subprocess.run([BASH, str(script), *args], cwd=root, env=full, capture_output=True, timeout=20,
                                  stdin=subprocess.DEVNULL)  # fmt: skip
        except subprocess.TimeoutExpired:
            return TIMEOUT
        if b"Text file busy" not in done.stderr:
            break
        for rec in (root / ".stubs" / "log").iterdir():
            rec.unlink()
    for rec in sorted((root / ".stubs" / "log").iterdir(), key=lambda p: int(p.name)):
        argv = [a.decode() for a in rec.read_bytes().split(b"\0")[:-1]]
        got = find_entry([Val(a) for a in argv])
        if got is not None and got[2] is not None:
            return argv[got[1] :]
    return None


def classify(text: str, root: Path, extra_env: dict[str, str], args: tuple[str, ...]) -> tuple[str, str]:
    """("exact" | "refused" | "bash-stops" | "MISREAD", detail) for one script in one environment."""
    env = {**_scratch(root), **extra_env}
    truth = bash_truth(text, root, env, args)
    if truth is TIMEOUT:
        return "bash-timeout", ""
    sets = {**env, "PWD": str(root), **ASSUMED}
    try:
        read = read_script(text, extra=args, sets=sets, env_complete=True)
        got = [a.text for a in read.args] if read.exact else None
        why = "" if read.exact else read.unknown[0].unknown
    except LaunchError as exc:
        got, why = None, str(exc)
    if got is None:
        assert re.search(r"line \d+|no verl launch|bytes", why), why  # a refusal names the line and construct
        return ("refused" if truth is not None else "bash-stops"), why
    if got != truth:
        return "MISREAD", f"bash: {truth}\nlabkit: {got}"
    return "exact", ""


def _run_set(name: str, tmp_path: Path, extra_env: dict, args: tuple) -> dict[str, tuple[str, str]]:
    scripts = sorted((DATA / name).rglob("*.sh"))

    def one(k_path):
        k, path = k_path
        root = tmp_path / f"s{k}"
        root.mkdir()
        return str(path.relative_to(DATA / name)), classify(path.read_text(), root, extra_env, args)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, enumerate(scripts)))


@pytest.mark.parametrize("env_name", ["bare", "user"])
@pytest.mark.parametrize("name", SETS)
def test_verl_scripts_read_as_bash_reads_them(name, env_name, tmp_path, capsys):
    extra_env, args = ({}, ()) if env_name == "bare" else (USER_ENV, USER_ARGS)
    results = _run_set(name, tmp_path, extra_env, args)
    kinds = ("exact", "refused", "bash-stops", "MISREAD", "bash-timeout")
    counts = {k: sum(1 for v, _ in results.values() if v == k) for k in kinds}
    with capsys.disabled():
        print(
            f"\n{name} ({env_name} environment): {counts['exact']} exact / {counts['refused']} refused / "
            f"{counts['bash-stops']} refused where bash stops too / {counts['MISREAD']} misread / "
            f"{len(results)} total"
            + (f" ({counts['bash-timeout']} timed out in bash)" if counts["bash-timeout"] else "")
        )
    misread = {k: d for k, (v, d) in results.items() if v == "MISREAD"}
    assert not misread, misread
    assert counts["bash-timeout"] <= 0.05 * len(results), results
    assert counts["exact"] >= 0.9 * (len(results) - counts["bash-stops"] - counts["bash-timeout"]), results


# -- one construct at a time, against bash -------------------------------------------------------------------------
CASES = {
    "quoting": """A='x y'; B="q \\"$A\\" \\$HOME"; python3 -m verl.trainer.main_ppo a.b="$A" c='$A' d=$B e=\\' f="" """,
    "arrays": """X=(one "two three"); X+=(four); E=()
python3 -m verl.trainer.main_ppo "${X[@]}" ${X[@]} "${E[@]}" "${X[*]}" "${X[1]}" ${#X[@]}""",
    "defaults": """U=; V=set
python3 -m verl.trainer.main_ppo a=${U:-d1} b=${U-d2} c=${V:+alt} d=${NONE:=fill} e=$NONE f=${U:+x} g=${#V}""",
    "arith": """N=4; M=$((N * 3 + 1)); python3 -m verl.trainer.main_ppo a=$((M / 2)) b=$(( (N+1) % 3 )) c=$((2**10))""",
    "branches": """BK=vllm
if [ "$BK" = sglang ]; then X=1; elif [[ $BK == v* && -n "$BK" ]]; then X=2; else X=3; fi
case "$BK" in sg*) Y=a;; vllm|hf) Y=b;; *) Y=c;; esac
(( X > 1 )) && Z=yes || Z=no
python3 -m verl.trainer.main_ppo x=$X y=$Y z=$Z""",
    "launchers": """export A=1
VAR=1 torchrun --nproc_per_node=8 -m verl.trainer.main_ppo a.b=1 \\
    c.d=2 `# a comment` # trailing
""",
    "ray": """ray job submit --address=http://x:8265 --runtime-env=r.yaml -- python3 -m verl.trainer.main_ppo k=v "$@" """,
    "uv": """LAUNCH=(uv run --extra vllm python3); "${LAUNCH[@]}" -m recipe.dapo.main_dapo k=v "${@:2}" """,
    "env cleaning": """export KEEP=1
for v in $(env | awk -F= '/^(PMI|PMIX|SLURM)_/{print $1}'); do
    unset "$v"
done
python3 -m verl.trainer.main_ppo a.b=$KEEP c.d=$HOME/x e.f=${SLURM_JOB_ID:-none}""",
    "not an integer": """TP=${1:-4}
if [ $TP -eq 4 ]; then B=1024; else B=384; fi
python3 -m verl.trainer.main_ppo b=$B""",
    "custom entry": """python3 tools/prep.py --out x.parquet
python3 examples/split_placement/main_ps.py algorithm.adv_estimator=gae data.train_batch_size=8 "$@" """,
    "heredoc": """cat > f.py << 'EOF'
python3 -m verl.trainer.main_ppo not=this
EOF
for v in a b; do L+=($v.k=1); done
python3 -m verl.trainer.main_ppo "${L[@]}" p=$(pwd) q=$(echo hi there)""",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_construct_read_as_bash_reads_it(case, tmp_path):
    args = ("extra.a=1", "extra.b=two words")
    env = _scratch(tmp_path)
    truth = bash_truth(CASES[case], tmp_path, env, args)
    assert truth is not None, case
    read = read_script(CASES[case], extra=args, sets={**env, "PWD": str(tmp_path)}, env_complete=True)
    assert read.exact and [a.text for a in read.args] == truth


def test_unknown_values_are_refused_with_line_and_construct_then_set():
    text = "set -euo pipefail\nNP=$(nproc)\nTS=$(date +%s)\necho $TS\npython3 -m verl.trainer.main_ppo n=$NP t=1\n"
    read = read_script(text)
    assert not read.exact and read.unknown[0].unknown.startswith("line 2: command substitution $(nproc)")
    assert read.unknown[0].shown() == "n=…"
    again = read_script(text, sets={"NP": "16"})
    assert [a.text for a in again.args] == ["n=16", "t=1"] and any(k.startswith("NP") for k in again.assumed)


def test_environment_variables_defaults_assumed_bare_ones_unknown():
    read = read_script("N=${NNODES:-2}\npython3 -m verl.trainer.main_ppo trainer.nnodes=$N d=$HOME/x\n")
    assert read.assumed == {"NNODES": 1}
    assert read.args[0].text == "trainer.nnodes=2" and read.args[1].unknown.startswith("line 2: $HOME is never set")
    assert read_script("python3 -m verl.trainer.main_ppo d=$HOME/x", sets={"HOME": "/h"}).args[0].text == "d=/h/x"


def test_branch_on_an_unknown_value_keeps_what_branches_agree_on():
    text = """D=$(probe)
case "$D" in gpu) G=8;; npu) G=16;; *) exit 1;; esac
M=2
python3 -m verl.trainer.main_ppo a.m=$M a.g=$G"""
    read = read_script(text)
    assert read.args[0].text == "a.m=2" and "case on a value labkit does not know" in read.args[1].unknown
    assert [a.text for a in read_script(text, sets={"D": "npu"}).args] == ["a.m=2", "a.g=16"]
    assert "it sets $D: pass --set D=VALUE" in read.args[1].unknown


def test_the_device_probe_names_the_variable_and_what_a_cuda_machine_gives():
    text = """DEVICE=${DEVICE:-$(python3 -c 'import torch_npu' 2>/dev/null && echo npu || echo gpu)}
case "$DEVICE" in gpu) G=8;; npu) G=16;; esac
python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$G"""
    why = read_script(text).args[0].unknown
    assert "it sets $DEVICE: pass --set DEVICE=VALUE (a CUDA machine gives gpu)" in why
    assert read_script(text, sets={"DEVICE": "gpu"}).args[0].text == "trainer.n_gpus_per_node=8"


@pytest.mark.parametrize(
    "text, message",
    [
        ("source env.sh\npython3 -m verl.trainer.main_ppo a=1", "line 1: source FILE"),
        ("f() { echo; }\npython3 -m verl.trainer.main_ppo a=1", "line 1: a function definition"),
        ("while true; do :; done\npython3 -m verl.trainer.main_ppo", "line 1: a while loop"),
        ("echo 'open\npython3 -m verl.trainer.main_ppo a=1", "line 1: cannot parse: a single quote is never closed"),
        ("X=1\nexit 0\npython3 -m verl.trainer.main_ppo a=1", "no verl launch"),
        ("if [ -f x ]; then python3 -m verl.trainer.main_ppo a=1; fi", "line 1: the launch depends on line 1: an if"),
        ("echo ${X/a/b}\npython3 -m verl.trainer.main_ppo a=${X/a/b}", None),
        ("python3 -m verl.trainer.main_ppo a=$((1/0))", "line 1: $((1/0)): division by 0"),
    ],
)
def test_refusals_name_the_line_and_construct(text, message):
    try:
        read = read_script(text)
    except LaunchError as exc:
        assert message is not None and str(exc).startswith(message), str(exc)
        return
    assert message is None and read.unknown[0].unknown == "line 2: ${X/a/b} is not evaluated"


def test_never_executes_and_bounds_input(tmp_path):
    marker = tmp_path / "ran"
    read = read_script(f"touch {marker}\n$(touch {marker})\npython3 -m verl.trainer.main_ppo a=1")
    assert not marker.exists() and [a.text for a in read.args] == ["a=1"]
    with pytest.raises(LaunchError, match="at most"):
        read_script("#" * (MAX_SCRIPT_BYTES + 1))
    big = "A=x\n" + "A=$A$A\n" * 40 + "python3 -m verl.trainer.main_ppo a=$A"
    with pytest.raises(LaunchError, match="grows past"):
        read_script(big)


def test_script_reader_is_linear_on_a_long_script():
    import time

    lines = "".join(f"V{k}=${{V{k}:-{k}}}\n" for k in range(5_000))  # about 90 KB, under MAX_SCRIPT_BYTES
    assert len(lines) < MAX_SCRIPT_BYTES
    t0 = time.perf_counter()
    read = read_script(lines + "python3 -m verl.trainer.main_ppo a=$V4999")
    assert read.args[0].text == "a=4999" and time.perf_counter() - t0 < 10
    assert os.environ.get("V1") is None


# -- the two scripts of the issue: one reader for the CLI and the dashboard ----------------------------------------
QWEN3_4B = DATA / "verl-1dda039" / "examples" / "grpo_trainer" / "run_qwen3_4b_fsdp.sh"
DAPO = DATA / "verl-9cd3542" / "examples" / "gmpo_trainer" / "test_dapo_7b_math.sh"


def test_dapo_script_gets_an_answer_from_check(capsys, monkeypatch):
    from labkit.cli import main
    from labkit.config.text_input import load_script_config

    monkeypatch.delenv("HOME", raising=False)  # a caller without HOME: the paths under it stay unread
    rc = main(["check", str(DAPO)])
    out = capsys.readouterr()
    assert rc in (0, 1) and out.out.startswith("verl "), out
    assert "read 69 verl override(s) at line 66" in out.err and "not read: data.train_files=…/verl/data" in out.err
    cfg, read = load_script_config(DAPO.read_text())
    assert cfg.added == {
        "actor_rollout_ref.model.override_config.max_position_embeddings": 32768,
        "reward.reward_kwargs.overlong_buffer_cfg.enable": True,
        "reward.reward_kwargs.overlong_buffer_cfg.len": 4096,
        "reward.reward_kwargs.overlong_buffer_cfg.penalty_factor": 1.0,
        "reward.reward_kwargs.overlong_buffer_cfg.log": False,
        "reward.reward_kwargs.max_resp_len": 8192,
    }  # +key=value outside verl's schema: accepted, not modelled
    assert cfg.get("actor_rollout_ref.actor.ppo_max_token_len_per_gpu") == (2048 + 8192) * 2  # $(((a + b) * 2))
    assert cfg.get("data.train_batch_size") == 512 and cfg.n_gpus == 64  # ${NNODES:-8} x ${NGPUS_PER_NODE:-8}
    assert cfg.get("actor_rollout_ref.model.path") == "…/verl/models/Qwen2.5-Math-7B"  # $HOME is the caller's
    assert main(["read", str(DAPO), "--set", "HOME=/home/me"]) == 0
    assert "data.train_files=/home/me/verl/data/dapo-math-17k.parquet" in capsys.readouterr().out.splitlines()


def test_home_user_and_pwd_come_from_the_caller_as_bash_takes_them(capsys, monkeypatch):
    from labkit.cli import main

    monkeypatch.setenv("HOME", "/home/me")
    assert main(["read", str(DAPO)]) == 0
    out = capsys.readouterr()
    assert "data.train_files=/home/me/verl/data/dapo-math-17k.parquet" in out.out.splitlines()
    assert "taken from your environment, as bash does: HOME=/home/me" in out.err


def test_pasted_qwen3_4b_script_shows_its_micro_size_and_dynamic_batching():
    from labkit.ui import dashboard_state as S
    from labkit.ui.dashboard_view import render

    text = QWEN3_4B.read_text()
    st = S.quick(S.Inputs(text))
    view = render(st)
    # read: the micro size and dynamic batching set through ACTOR=( ... ) and ${VAR:-default}
    for item in ("ppo_micro_batch_size_per_gpu=2", "actor.use_dynamic_bsz=True", "ppo_max_token_len_per_gpu=3000"):
        assert item in view.status, item
    # not judged: the GPU count and memory share depend on DEVICE, which $(python3 -c 'import torch_npu') decides
    assert st.code == "input" and view.figures == [] and "line 10: command substitution" in str(st.error)
    st = S.evaluate(S.Inputs("DEVICE=gpu\n" + text))  # what the caller's environment (or --set) says
    cfg = st.cfg
    assert cfg.get("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu") == 2 and st.dynamic
    assert cfg.get("actor_rollout_ref.actor.use_dynamic_bsz") is True and cfg.n_gpus == 8
    assert st.report is not None and st.trace is not None


def test_a_text_with_no_launch_is_not_judged():
    from labkit.config.text_input import NOTHING_READ
    from labkit.ui import dashboard_state as S
    from labkit.ui.dashboard_view import render

    st = S.quick(S.Inputs("echo hello\nls -l\n"))
    assert st.code == "input" and str(st.error).startswith(NOTHING_READ) and render(st).figures == []


# -- Hydra's forms and the command line ----------------------------------------------------------------------------
def test_hydra_forms():
    from labkit.config.messages import ConfigError
    from labkit.config.verl_config import load_config

    cfg = load_config(
        None,
        [
            "+actor_rollout_ref.model.override_config.attention_dropout=0.0",  # outside the schema: added
            "++data.train_batch_size=64",  # add or override
            "+data.gen_batch_size=32",  # verl's default is null: + may add it
            "trainer.logger=['console','wandb']",  # a list (a key verl has, labkit does not model)
            "actor_rollout_ref.rollout.name='vllm'",  # a quoted value
            "data.val_batch_size=null",
            "model_engine=dp",
            "~trainer.nnodes",
        ],
    )
    assert cfg.added == {"actor_rollout_ref.model.override_config.attention_dropout": 0.0}
    assert cfg.get("data.train_batch_size") == 64 and cfg.get("data.gen_batch_size") == 32
    assert cfg.ignored["trainer.logger"] == ["console", "wandb"] and cfg.get("data.val_batch_size") is None
    with pytest.raises(ConfigError, match=r"Could not append to config. An item is already at 'data.train_batch_size'"):
        load_config(None, ["+data.train_batch_size=64"])
    with pytest.raises(ConfigError, match="unknown key 'data.train_batch_sise'"):
        load_config(None, ["data.train_batch_sise=64"])  # no + : a key outside the schema is a typo


@pytest.mark.parametrize(
    "script, message",
    [
        ("python3 -m verl.trainer.main_ppo --config-name=my_recipe a.b=1", "--config-name my_recipe"),
        ("python3 -m verl.trainer.main_ppo --config-path=/opt/dapo/cfg --config-name=dapo x=1", "in /opt/dapo/cfg"),
        (
            "python3 -m verl.trainer.main_ppo model_engine=torchtitan",
            "labkit models model_engine=dp|megatron|veomni only",
        ),
        ("python3 -m verl.trainer.main_generation_server a=1", "the entry point verl.trainer.main_generation_server"),
        ("python3 -m verl.trainer.main_ppo_sync a=1", "verl 0.8.0's TransferQueue sync trainer"),
        ("python3 -m verl.trainer.main_ppo trainer.n_gpus_per_node=$(nproc)", "line 1: command substitution $(nproc)"),
    ],
)
def test_check_refuses_what_it_does_not_model(tmp_path, capsys, script, message):
    from labkit.cli import main

    path = tmp_path / "run.sh"
    path.write_text(script)
    assert main(["check", str(path)]) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_labkit_read_cli(tmp_path, capsys, monkeypatch):
    import io

    from labkit.cli import main

    path = tmp_path / "run.sh"
    path.write_text('BS=${BS:-64}\npython3 -m verl.trainer.main_ppo data.train_batch_size=$BS "$@"\n')
    assert main(["read", str(path), "x.y=1", "--set", "BS=8"]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["data.train_batch_size=8", "x.y=1"] and out.err == ""
    assert main(["read", str(path)]) == 0
    out = capsys.readouterr()
    assert out.out.splitlines() == ["data.train_batch_size=64"] and "BS (line 1)" in out.err
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(b"python3 -m verl.trainer.main_ppo a=$(date)\n")))
    assert main(["read", "-"]) == 2
    assert "-: line 1: command substitution $(date) is not run" in capsys.readouterr().err
    assert main(["check", str(path), "--set", "BS=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]) in (0, 1)


def test_mutated_scripts_give_a_clear_error_or_a_reading():
    """Random edits of verl's scripts (unclosed quotes, stray brackets, cut lines): a reading or LaunchError, never
    another exception or a hang."""
    import random
    import time

    from labkit.config.messages import ConfigError
    from labkit.config.text_input import load_pasted_config

    rng = random.Random(7)
    files = sorted(DATA.rglob("*.sh"))
    chars = list("$(){}[]'\"\\`|&;<>#=+-~*?! \n\t:%/0123456789abxyz@")
    t0 = time.perf_counter()
    for _ in range(300):
        text = list(rng.choice(files).read_text())
        for _ in range(rng.randrange(1, 6)):
            i = rng.randrange(len(text) + 1)
            if rng.random() < 0.5 and text:
                del text[min(i, len(text) - 1)]
            else:
                text.insert(i, rng.choice(chars))
        for fn in (read_script, load_pasted_config):
            try:
                fn("".join(text))
            except (LaunchError, ConfigError):
                pass
    assert time.perf_counter() - t0 < 20


def test_a_script_at_the_size_cap_is_read_in_bounded_time():
    """Linear-time input limits: a script of MAX_SCRIPT_BYTES of commands answers within a second on quiet cores
    (two here, beside a second test process)."""
    import time

    line = 'echo "step $X" ${Y:-1} $((2 + 3))\n'
    text = line * (MAX_SCRIPT_BYTES // len(line))
    start = time.perf_counter()
    with pytest.raises(LaunchError, match="no verl launch"):
        read_script(text)
    assert time.perf_counter() - start < 2.0


def test_a_config_group_into_a_package_is_refused_by_name():
    from labkit.config.hydra_overrides import HydraError, parse_override

    with pytest.raises(HydraError, match="GROUP@PACKAGE=OPTION"):
        parse_override("actor@actor_rollout_ref.actor=mlite_actor")
