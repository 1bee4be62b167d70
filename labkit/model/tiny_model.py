"""The project's tiny Qwen2 causal LM: tokenizer recipe, config, offline loaders and prompt helpers.

The weights in ``data/tiny-qwen2`` are produced by ``scripts/train_tiny_model.py`` (never downloaded). The tokenizer uses
Qwen2's exact pipeline (NFC + Qwen2's split regex + byte-level BPE), because transformers' AutoTokenizer returns
``Qwen2Tokenizer`` for a qwen2 folder and rebuilds that pipeline from vocab and merges: any other pipeline would
silently encode to different ids.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from labkit.model.tiny_task import EOS_TOKEN, TinyExample, make_examples

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA_DIR = REPO_ROOT / "data"
TINY_MODEL_DIR = DATA_DIR / "tiny-qwen2"

VOCAB_SIZE = 320  # tokenizer size == model vocab (256 bytes + BPE merges + specials, padded with reserved specials)
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", "<|im_end|>"]
MAX_PROMPT_TOKENS = 24
MAX_RESPONSE_TOKENS = 32

# Heads divisible by 2 and 4 (Ulysses SP=2, rollout TP=2), intermediate divisible by 4.
TINY_CONFIG: dict[str, Any] = dict(
    vocab_size=VOCAB_SIZE,
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=128,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    tie_word_embeddings=True,
    initializer_range=0.02,
)


def build_tokenizer(seed: int = 0, n_corpus: int = 2000) -> Any:
    """Train the byte-level BPE with Qwen2's pipeline on task prompts; returns a ``PreTrainedTokenizerFast``.

    Digits never merge (Qwen2's regex isolates each digit), so merges only shorten the op words.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=SPECIAL_TOKENS,
        show_progress=False,
    )
    corpus = [ex.prompt + ex.answer for ex in make_examples(n_corpus, seed)]
    tok.train_from_iterator(corpus, trainer)
    n_reserved = VOCAB_SIZE - tok.get_vocab_size()
    if n_reserved < 0:
        raise ValueError(f"BPE vocabulary {tok.get_vocab_size()} exceeds VOCAB_SIZE {VOCAB_SIZE}")
    tok.add_special_tokens([f"<|reserved_{i}|>" for i in range(n_reserved)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        padding_side="left",
        model_max_length=MAX_PROMPT_TOKENS + MAX_RESPONSE_TOKENS,
    )


def build_config(tokenizer: Any | None = None, **overrides: Any) -> Any:
    """The Qwen2Config of the tiny model (EOS = pad = ``<|endoftext|>``)."""
    from transformers import Qwen2Config

    eos_id = 0 if tokenizer is None else tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    kw = dict(TINY_CONFIG, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id, use_cache=True)
    kw.update(overrides)
    return Qwen2Config(**kw)


def count_params(model: torch.nn.Module) -> int:
    """Unique parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def load_tiny_tokenizer(path: str | os.PathLike = TINY_MODEL_DIR) -> Any:
    """AutoTokenizer on the shipped folder, offline (it resolves to Qwen2Tokenizer; ids equal tokenizer.json's)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def load_tiny_model(
    path: str | os.PathLike = TINY_MODEL_DIR, dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa"
) -> torch.nn.Module:
    """AutoModelForCausalLM on the shipped folder, offline, in eval mode."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    shown = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # its "Loading weights" bar is a red stderr block in a notebook, for 1 file
    try:
        model = AutoModelForCausalLM.from_pretrained(
            str(path), dtype=dtype, local_files_only=True, attn_implementation=attn_implementation
        )
    finally:
        if shown:
            hf_logging.enable_progress_bar()
    return model.eval()


def make_prompts(n: int, seed: int, tokenizer: Any | None = None) -> dict[str, Any]:
    """n task prompts (seeded): texts, reference answers, ops and unpadded prompt token ids."""
    tokenizer = tokenizer if tokenizer is not None else load_tiny_tokenizer()
    examples = make_examples(n, seed)
    texts = [ex.prompt for ex in examples]
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
    return {
        "texts": texts,
        "answers": [ex.answer for ex in examples],
        "ops": [ex.op for ex in examples],
        "input_ids": ids,
    }


def encode_example(tokenizer: Any, ex: TinyExample) -> tuple[list[int], list[int]]:
    """(prompt ids, response ids) for SFT; the response is the answer followed by EOS."""
    p = tokenizer(ex.prompt, add_special_tokens=False)["input_ids"]
    r = tokenizer(ex.answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return p, r


def left_pad(ids: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad a list of id lists: (input_ids, attention_mask), as verl's rollout feeds prompts."""
    width = max(len(x) for x in ids)
    input_ids = torch.full((len(ids), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), width), dtype=torch.long)
    for i, x in enumerate(ids):
        if x:
            input_ids[i, width - len(x) :] = torch.tensor(x)
            mask[i, width - len(x) :] = 1
    return input_ids, mask


@torch.no_grad()
def generate_answers(
    model: torch.nn.Module,
    tokenizer: Any,
    prompts: list[str],
    do_sample: bool = False,
    temperature: float = 1.0,
    seed: int | None = None,
    max_new_tokens: int = MAX_RESPONSE_TOKENS,
) -> dict[str, Any]:
    """HF generate on left-padded prompts; returns response ids (up to and including EOS), texts and lengths."""
    ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in prompts]
    input_ids, mask = left_pad(ids, tokenizer.pad_token_id)
    if seed is not None:
        torch.manual_seed(seed)
    kw: dict[str, Any] = dict(do_sample=do_sample, max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
    kw.update(
        dict(temperature=temperature, top_k=0, top_p=1.0)
        if do_sample
        else dict(temperature=None, top_k=None, top_p=None)
    )
    out = model.generate(input_ids=input_ids, attention_mask=mask, **kw)[:, input_ids.shape[1] :]
    eos = tokenizer.eos_token_id
    responses, ended = [], []
    for row in out.tolist():
        cut = row.index(eos) + 1 if eos in row else len(row)
        responses.append(row[:cut])
        ended.append(eos in row)
    texts = [tokenizer.decode(r, skip_special_tokens=False) for r in responses]
    return {"response_ids": responses, "texts": texts, "lengths": [len(r) for r in responses], "ended_with_eos": ended}
