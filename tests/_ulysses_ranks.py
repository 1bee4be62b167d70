"""Rank processes and shared fixtures for tests/test_packing_ulysses.py (module level, so spawn can import them).

One spawn of 4 gloo ranks runs every SP check: an actor mesh (dp=2, sp=2), where dp group d gets batch d (one batch
with nnz divisible by 2, one not), then (dp=1, sp=4) on one batch (kv heads 2 < sp 4: repeated). Results go back as
numpy / python values only (a torch tensor through an mp queue can hang the parent).
"""

from __future__ import annotations

import time
import traceback

import numpy as np
import torch

from labkit.model.ulysses_demo import report_and_exit

CFG = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=64,
    tie_word_embeddings=False,
)
PROMPT_WIDTH, RESPONSE_WIDTH = 10, 8
# (prompt lengths, response lengths) per batch: 4 rows of different lengths, left-padded prompts, right-padded
# responses (one response fills the width, one row has a 1-token prompt).
BATCHES = {
    "even": ([3, 10, 6, 1], [8, 2, 5, 1]),  # nnz 36: divisible by 2 and 4
    "odd": ([4, 9, 2, 7], [1, 8, 6, 2]),  # nnz 39: Ulysses pad 1 (sp=2) / 1 (sp=4)
}
TEMPERATURE = 0.7


def build_model(state_path: str | None = None) -> torch.nn.Module:
    """Random-init tiny Qwen2 (4 heads, 2 kv heads, fp32, sdpa, config.use_cache left at its default True)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = Qwen2ForCausalLM(Qwen2Config(**CFG, attn_implementation="sdpa"))
    if state_path is not None:
        model.load_state_dict(torch.load(state_path))
    return model.eval()


def make_batch(name: str, seed: int = 0) -> dict[str, np.ndarray]:
    """A verl-shaped micro-batch as numpy: input_ids/attention_mask/position_ids (4, P+R), responses (4, R),
    response_mask (4, R) and loss weights (4, R)."""
    plens, rlens = BATCHES[name]
    rng = np.random.default_rng(seed + len(name))
    bsz, width = len(plens), PROMPT_WIDTH + RESPONSE_WIDTH
    ids = np.zeros((bsz, width), dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, (p, r) in enumerate(zip(plens, rlens)):
        ids[i, PROMPT_WIDTH - p : PROMPT_WIDTH + r] = rng.integers(1, CFG["vocab_size"], size=p + r)
        mask[i, PROMPT_WIDTH - p : PROMPT_WIDTH + r] = 1
    pos = np.clip(np.cumsum(mask, axis=1) - 1, 0, None)
    return {
        "input_ids": ids,
        "attention_mask": mask,
        "position_ids": pos,
        "responses": ids[:, PROMPT_WIDTH:].copy(),
        "response_mask": mask[:, PROMPT_WIDTH:].copy(),
        "weights": rng.normal(size=(bsz, RESPONSE_WIDTH)),
    }


def to_micro(batch: dict[str, np.ndarray]) -> dict[str, torch.Tensor]:
    return {k: torch.from_numpy(batch[k]) for k in ("input_ids", "attention_mask", "position_ids", "responses")}


def grads_of_weighted_logprob(model, batch, use_remove_padding: bool = True, **kw):
    """Σ w·mask·log p over the response (a stand-in for the PPO loss), its backward: (log-probs, parameter grads)."""
    from labkit.model.logprob import forward_micro_batch

    model.zero_grad(set_to_none=True)
    lp, _ = forward_micro_batch(
        model, to_micro(batch), use_remove_padding=use_remove_padding, temperature=TEMPERATURE, **kw
    )
    loss = (lp * torch.from_numpy(batch["weights"]).float() * torch.from_numpy(batch["response_mask"])).sum()
    loss.backward()
    return lp, {n: p.grad.detach().clone() for n, p in model.named_parameters()}


def _run_sp_case(model, batch, group, res: dict, tag: str) -> None:
    """log-probs / entropy under no_grad (chunked and naive), then grads all-reduced (avg) over the SP group."""
    import torch.distributed as dist

    from labkit.model.logprob import forward_micro_batch
    from labkit.runtime import dist as ldist

    micro = to_micro(batch)
    c0 = ldist.collective_counts()
    t0 = time.perf_counter()
    with torch.no_grad():
        lp, ent = forward_micro_batch(
            model,
            micro,
            use_remove_padding=True,
            sp_group=group,
            temperature=TEMPERATURE,
            calculate_entropy=True,
            chunked=True,
        )
    res[f"{tag}/fwd_s"] = time.perf_counter() - t0
    c1 = ldist.collective_counts()
    res[f"{tag}/counts_fwd"] = {k: c1.get(k, 0) - c0.get(k, 0) for k in c1}
    with torch.no_grad():
        lp_naive, _ = forward_micro_batch(
            model, micro, use_remove_padding=True, sp_group=group, temperature=TEMPERATURE, chunked=False
        )
    res[f"{tag}/lp"], res[f"{tag}/ent"], res[f"{tag}/lp_naive"] = lp.numpy(), ent.numpy(), lp_naive.numpy()
    model.train()
    t0 = time.perf_counter()
    lp_grad, grads = grads_of_weighted_logprob(model, batch, sp_group=group)
    res[f"{tag}/fwd_bwd_s"] = time.perf_counter() - t0
    model.eval()
    res[f"{tag}/lp_grad"] = lp_grad.detach().numpy()
    res[f"{tag}/local_embed_grad"] = grads["model.embed_tokens.weight"].numpy()
    sp = dist.get_world_size(group)
    for name, g in grads.items():  # what FSDP's gradient reduction does inside one DP group: average over SP ranks
        ldist.all_reduce(g, op="sum", group=group)
        res.setdefault(f"{tag}/grads", {})[name] = (g / sp).numpy()


def _collective_checks(group, res: dict, tag: str) -> None:
    """SeqAllToAll against the known layout, its round trip, and Gather's ×sp gradient on the kept part."""
    import torch.distributed as dist

    from labkit.model.ulysses import gather_outputs_and_unpad
    from labkit.model.ulysses_communications import SeqAllToAll

    sp, r = dist.get_world_size(group), dist.get_rank(group)
    full = torch.arange(2 * 8 * (4 * sp) * 3, dtype=torch.float32).view(2, 8, 4 * sp, 3)  # (b, heads, seq, d)
    local = full[:, :, 4 * r : 4 * (r + 1)].clone().requires_grad_(True)
    heads = SeqAllToAll.apply(group, local, 1, 2)
    res[f"{tag}/a2a_ok"] = bool(torch.equal(heads, full[:, (8 // sp) * r : (8 // sp) * (r + 1)]))
    back = SeqAllToAll.apply(group, heads, 2, 1)
    res[f"{tag}/a2a_roundtrip_ok"] = bool(torch.equal(back, local))
    (back * 2).sum().backward()
    res[f"{tag}/a2a_grad_ok"] = bool(torch.equal(local.grad, torch.full_like(local, 2.0)))
    x = torch.full((3,), float(r), requires_grad=True)
    y = gather_outputs_and_unpad(x, gather_dim=0, unpad_dim=0, padding_size=2, group=group)
    y.sum().backward()
    res[f"{tag}/gathered"] = y.detach().numpy()
    res[f"{tag}/gather_grad"] = x.grad.numpy()


def rank_main(rank: int, world: int, port: int, payload: dict, out_q) -> None:
    """One rank of the 4-process SP job; puts (rank, results) and exits."""
    res: dict = {"t_entry": time.time()}
    try:
        torch.set_num_threads(1)
        import transformers.models.qwen2.modeling_qwen2  # noqa: F401  (heavy import before the rendezvous)

        res["t_import"] = time.time()

        from labkit.model.ulysses import apply_ulysses_patch
        from labkit.runtime import dist as ldist
        from labkit.runtime import meshes, process_group

        t0 = time.perf_counter()
        process_group.init_dist(rank, world, port, timeout_s=60.0)
        res["init_s"] = time.perf_counter() - t0
        mesh2, mesh4 = meshes.actor_mesh(sp=2), meshes.actor_mesh(sp=4)
        sp2, sp4 = mesh2["sp"].get_group(), mesh4["sp"].get_group()
        model = apply_ulysses_patch(build_model(payload["state_path"]), 4)
        dp_rank = mesh2.get_local_rank("dp")
        res["dp_rank"], res["sp_rank"] = dp_rank, mesh2.get_local_rank("sp")
        _collective_checks(sp2, res, "sp2")
        _run_sp_case(model, payload["batches"][["even", "odd"][dp_rank]], sp2, res, "sp2")
        _collective_checks(sp4, res, "sp4")
        _run_sp_case(model, payload["batches"]["odd"], sp4, res, "sp4")
        ldist.barrier()
        process_group.teardown()
    except BaseException:  # report, never leave the parent waiting for its timeout
        res = {"error": traceback.format_exc()}
    report_and_exit(out_q, rank, res)
