"""gguf_vocab.py - a placeholder vocabulary for the GGUF files of random-weight models, which have no
tokenizer (llama.cpp loads no model without one; its benchmarks feed token ids, or text by byte fallback):
"llama" (SentencePiece) with <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF> (type 6) and numbered
tokens t259 ... t(V-1).  Used by hf_to_gguf.py --placeholder-vocab and bench/write_gguf.py."""

BYTE_TOKENS = 256


def add_placeholder_vocab(w, V):
    """Write the vocabulary of V tokens and the unknown token's id to gguf.GGUFWriter w."""
    nb = BYTE_TOKENS
    w.add_tokenizer_model("llama")
    w.add_token_list(["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(nb)] + ["t%d" % i for i in range(3 + nb, V)])
    w.add_token_scores([0.0] * V)
    w.add_token_types([2, 3, 3] + [6] * nb + [1] * (V - 3 - nb))
    w.add_unk_token_id(0)
