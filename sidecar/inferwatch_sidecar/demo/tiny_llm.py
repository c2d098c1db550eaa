"""A tiny random-weight Llama and a BPE tokenizer trained on the spot, written into a folder offline.

``inferwatch demo --engine vllm`` and the real-vLLM trace test serve it:
nothing is downloaded, the weights are seeded so the same folder comes out
every run, and the model is small enough (about 0.4 M parameters, bfloat16 as
vLLM's CPU backend runs it) for vLLM's CPU backend to load in seconds. It
needs ``torch``, ``transformers`` and ``tokenizers``, which vLLM brings, so it
runs with vLLM's interpreter::

    .venv-vllm/bin/python -m inferwatch_sidecar.demo.tiny_llm DIR

This module imports nothing beyond the standard library until :func:`make`
runs: the demo's own process reads :data:`WORDS` and :data:`CONTEXT` from it.
"""

from __future__ import annotations

import sys
from pathlib import Path

#: A vocabulary this size fits the corpus below with room for merges.
VOCAB = 384
#: 2 heads of 64: a head size vLLM's CPU attention supports. CONTEXT is the longest sequence, prompt included.
HIDDEN, HEADS, LAYERS, CONTEXT = 128, 2, 2, 512
#: Bumped whenever the model or the tokenizer changes, so that a cached folder of an older one is not reused.
REVISION = 1

TEXT = ("the model serves tokens to every request in the queue while the cache holds the keys and values "
        "of each sequence a batch runs prefill then decode one step at a time until the stream ends")
#: The tokenizer's words: each is one token once trained, so a prompt of n of them is about n tokens.
WORDS = tuple(TEXT.split())


def corpus(lines: int = 400) -> list[str]:
    """Deterministic sentences over ``WORDS`` (a linear congruential walk, no ``random`` state)."""
    out, x = [], 7
    for _ in range(lines):
        words = []
        for _ in range(12):
            x = (x * 1103515245 + 12345) % (1 << 31)
            words.append(WORDS[x % len(WORDS)])
        out.append(" ".join(words))
    return out


def make(folder: Path) -> None:
    """Write the tokenizer and the model's weights and config into ``folder`` (created if missing)."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=["<unk>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                   model_max_length=CONTEXT)
    fast.save_pretrained(folder)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=tok.get_vocab_size(), hidden_size=HIDDEN, intermediate_size=2 * HIDDEN, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, max_position_embeddings=CONTEXT,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, tie_word_embeddings=True,
        dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m inferwatch_sidecar.demo.tiny_llm DIR")
    make(Path(sys.argv[1]))
