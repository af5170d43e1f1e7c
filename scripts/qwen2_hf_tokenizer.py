"""The reference Qwen2 tokenizer of the fixture generators: Hugging Face
`tokenizers` built from a GGUF's own vocabulary and merges, with Qwen2's
tokenizer.json pipeline (normalizer NFC; Split on the pattern below, isolated;
ByteLevel without its own regex; ByteLevel decoder) and the GGUF's control and
user-defined tokens (token_type 3 and 4) as added special tokens.

Shared by scripts/make-qwen-tokenizer-fixture.py, make-chat-template-fixtures.py
and qwen_reference.py so that every fixture is measured against one reference.
Needs only `tokenizers` (imported lazily).
"""

QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
               r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


def qwen2_tokenizer(tokens, types, merges):
    """tokens: [str]; types: [int] (GGUF token_type); merges: ["a b", ...]."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
    from tokenizers import pre_tokenizers
    vocab = {t: i for i, t in enumerate(tokens)}
    assert len(vocab) == len(tokens), "duplicate token strings"
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if int(ty) in (3, 4)]
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for s in specials:  # Added tokens keep their GGUF ids.
        assert tok.token_to_id(s) == vocab[s], s
    return tok
