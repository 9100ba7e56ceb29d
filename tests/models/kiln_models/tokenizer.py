"""Byte-level BPE tokenizers in Hugging Face `tokenizer.json` form.

This is the reference the C++ runtime's tokenizer is checked against, and the trainer
that makes the tokenizers of generated checkpoints and of the demo model. It follows
the semantics of Hugging Face `tokenizers` for the subset Kiln supports:

- added tokens (special tokens) are matched first, leftmost-longest, and never split;
- pre-tokenisation by a regex (GPT-2's, or the Llama-3 / Qwen2 one), each piece's
  UTF-8 bytes mapped to printable characters by GPT-2's `bytes_to_unicode` table;
- BPE merges applied by rank (lowest rank first, leftmost on ties), as
  `tokenizers/src/models/bpe/word.rs` does;
- decoding maps characters back to bytes and decodes UTF-8 with replacement.

Only the `regex` module (Debian python3-regex) is needed beyond the standard library:
Python's `re` has no `\\p{L}`.
"""

from __future__ import annotations

import collections
import json
import os
from typing import Dict, Iterable, List, Optional, Sequence, Tuple, Union

import regex

# GPT-2's pre-tokenizer regex (tokenizers' ByteLevel with use_regex=true).
GPT2_PATTERN = (
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
)
# The Split regex of Llama-3 and Qwen2 tokenizer.json files (followed by a ByteLevel
# pre-tokenizer with use_regex=false).
LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PATTERNS = {"gpt2": GPT2_PATTERN, "llama3": LLAMA3_PATTERN}


def bytes_to_unicode() -> Dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    bs = (
        list(range(ord("!"), ord("~") + 1))
        + list(range(ord("\u00a1"), ord("\u00ac") + 1))
        + list(range(ord("\u00ae"), ord("\u00ff") + 1))
    )
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


BYTE_TO_CHAR = bytes_to_unicode()
CHAR_TO_BYTE = {c: b for b, c in BYTE_TO_CHAR.items()}


def _to_symbols(piece: str) -> str:
    return "".join(BYTE_TO_CHAR[b] for b in piece.encode("utf-8"))


class TokenizerError(ValueError):
    pass


class ByteLevelBPE:
    """A byte-level BPE tokenizer with added (special) tokens."""

    def __init__(
        self,
        vocab: Dict[str, int],
        merges: Sequence[Tuple[str, str]],
        added_tokens: Dict[str, int],
        pretokenizer: str = "gpt2",
        bos_token: Optional[str] = None,
        add_bos: bool = False,
        ignore_merges: bool = False,
    ):
        if pretokenizer not in PATTERNS:
            raise TokenizerError(
                f"unknown pre-tokenizer '{pretokenizer}' (supported: {', '.join(PATTERNS)})"
            )
        self.vocab = dict(vocab)
        self.merges = [tuple(m) for m in merges]
        self.added_tokens = dict(added_tokens)
        self.pretokenizer = pretokenizer
        self.pattern = regex.compile(PATTERNS[pretokenizer])
        self.bos_token = bos_token
        self.add_bos = add_bos
        self.ignore_merges = ignore_merges
        self.ranks = {m: i for i, m in enumerate(self.merges)}
        self.id_to_token: Dict[int, str] = {i: t for t, i in self.vocab.items()}
        for t, i in self.added_tokens.items():
            if i in self.id_to_token and self.id_to_token[i] != t:
                raise TokenizerError(f"added token '{t}' reuses id {i} of '{self.id_to_token[i]}'")
            self.id_to_token[i] = t
        if add_bos and (bos_token is None or bos_token not in self.added_tokens):
            raise TokenizerError("add_bos needs a bos_token that is an added token")
        # Leftmost-longest matching of added tokens: try longer ones first.
        self._added_re = (
            regex.compile("|".join(regex.escape(t) for t in sorted(self.added_tokens, key=len, reverse=True)))
            if self.added_tokens
            else None
        )
        self._cache: Dict[str, List[int]] = {}

    # ------------------------------------------------------------------ training
    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        vocab_size: int,
        special_tokens: Union[Dict[str, int], Sequence[str]] = (),
        pretokenizer: str = "gpt2",
        bos_token: Optional[str] = None,
        add_bos: bool = False,
        min_frequency: int = 2,
    ) -> "ByteLevelBPE":
        """Learns merges from `texts` until the vocabulary (bytes + merges, not
        counting special tokens) has `vocab_size` entries or no pair occurs
        `min_frequency` times. Deterministic: ties go to the lexicographically
        smallest pair.

        `special_tokens` as a list get ids right after the learned vocabulary; as a
        dict they keep the given ids (which may lie beyond it, as real checkpoints'
        image tokens do)."""
        if vocab_size < 256:
            raise TokenizerError(f"vocab_size {vocab_size} is smaller than the 256 byte tokens")
        pattern = regex.compile(PATTERNS[pretokenizer])
        if isinstance(special_tokens, dict):
            specials = dict(special_tokens)
        else:
            specials = {}
        special_list = list(special_tokens)
        split_re = (
            regex.compile("|".join(regex.escape(t) for t in sorted(special_list, key=len, reverse=True)))
            if special_list
            else None
        )

        word_freq: collections.Counter = collections.Counter()
        for text in texts:
            segments = split_re.split(text) if split_re else [text]
            for seg in segments:
                for piece in pattern.findall(seg):
                    word_freq[_to_symbols(piece)] += 1

        reserved = set(specials.values())
        next_id = 0

        def take_id() -> int:
            nonlocal next_id
            while next_id in reserved:
                next_id += 1
            i = next_id
            next_id += 1
            return i

        vocab: Dict[str, int] = {}
        for b in range(256):
            vocab[BYTE_TO_CHAR[b]] = take_id()

        words = {w: list(w) for w in word_freq}
        merges: List[Tuple[str, str]] = []
        while len(vocab) < vocab_size:
            pair_freq: collections.Counter = collections.Counter()
            for w, syms in words.items():
                f = word_freq[w]
                for a, b in zip(syms, syms[1:]):
                    pair_freq[(a, b)] += f
            if not pair_freq:
                break
            best = min(pair_freq.items(), key=lambda kv: (-kv[1], kv[0]))
            if best[1] < min_frequency:
                break
            (a, b), _ = best
            merged = a + b
            merges.append((a, b))
            if merged not in vocab:
                vocab[merged] = take_id()
            for w, syms in words.items():
                if len(syms) < 2:
                    continue
                out = []
                i = 0
                while i < len(syms):
                    if i + 1 < len(syms) and syms[i] == a and syms[i + 1] == b:
                        out.append(merged)
                        i += 2
                    else:
                        out.append(syms[i])
                        i += 1
                words[w] = out

        added: Dict[str, int] = dict(specials)
        for t in special_list:
            if t not in added:
                added[t] = take_id()
        return cls(vocab, merges, added, pretokenizer, bos_token=bos_token, add_bos=add_bos)

    # ------------------------------------------------------------------ encoding
    def _bpe(self, symbols: str) -> List[str]:
        if self.ignore_merges and symbols in self.vocab:
            return [symbols]
        word = list(symbols)
        while len(word) > 1:
            best_rank, best_i = None, -1
            for i in range(len(word) - 1):
                r = self.ranks.get((word[i], word[i + 1]))
                if r is not None and (best_rank is None or r < best_rank):
                    best_rank, best_i = r, i
            if best_rank is None:
                break
            a, b = word[best_i], word[best_i + 1]
            out = []
            i = 0
            while i < len(word):
                if i + 1 < len(word) and word[i] == a and word[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(word[i])
                    i += 1
            word = out
        return word

    def _encode_plain(self, text: str) -> List[int]:
        ids: List[int] = []
        for piece in self.pattern.findall(text):
            cached = self._cache.get(piece)
            if cached is None:
                cached = []
                for tok in self._bpe(_to_symbols(piece)):
                    if tok not in self.vocab:
                        raise TokenizerError(f"token {tok!r} produced by the merges is not in the vocabulary")
                    cached.append(self.vocab[tok])
                self._cache[piece] = cached
            ids.extend(cached)
        return ids

    def encode(self, text: str, add_special_tokens: bool = False) -> List[int]:
        """Token ids of `text`. Added tokens that appear literally in the text are
        recognised. With add_special_tokens, the BOS token is prepended when the
        tokenizer's post-processor adds one."""
        ids: List[int] = []
        if add_special_tokens and self.add_bos:
            ids.append(self.added_tokens[self.bos_token])
        pos = 0
        if self._added_re is not None:
            for m in self._added_re.finditer(text):
                ids.extend(self._encode_plain(text[pos : m.start()]))
                ids.append(self.added_tokens[m.group(0)])
                pos = m.end()
        ids.extend(self._encode_plain(text[pos:]))
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = False) -> str:
        out = bytearray()
        for i in ids:
            i = int(i)
            tok = self.id_to_token.get(i)
            if tok is None:
                raise TokenizerError(f"token id {i} is not in the vocabulary")
            if tok in self.added_tokens and self.added_tokens[tok] == i:
                if not skip_special_tokens:
                    out.extend(tok.encode("utf-8"))
                continue
            out.extend(CHAR_TO_BYTE[c] for c in tok)
        return out.decode("utf-8", errors="replace")

    def token_to_id(self, token: str) -> Optional[int]:
        if token in self.added_tokens:
            return self.added_tokens[token]
        return self.vocab.get(token)

    def id_to_piece(self, i: int) -> Optional[str]:
        return self.id_to_token.get(int(i))

    @property
    def max_id(self) -> int:
        return max(self.id_to_token)

    # ------------------------------------------------------------------ tokenizer.json
    def to_json(self) -> dict:
        added = [
            {
                "id": i,
                "content": t,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for t, i in sorted(self.added_tokens.items(), key=lambda kv: kv[1])
        ]
        if self.pretokenizer == "gpt2":
            pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
        else:
            pre = {
                "type": "Sequence",
                "pretokenizers": [
                    {
                        "type": "Split",
                        "pattern": {"Regex": LLAMA3_PATTERN},
                        "behavior": "Isolated",
                        "invert": False,
                    },
                    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
                ],
            }
        if self.add_bos:
            bos_id = self.added_tokens[self.bos_token]
            post = {
                "type": "TemplateProcessing",
                "single": [
                    {"SpecialToken": {"id": self.bos_token, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                ],
                "pair": [
                    {"SpecialToken": {"id": self.bos_token, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": self.bos_token, "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {self.bos_token: {"id": self.bos_token, "ids": [bos_id], "tokens": [self.bos_token]}},
            }
        else:
            post = {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
        return {
            "version": "1.0",
            "truncation": None,
            "padding": None,
            "added_tokens": added,
            "normalizer": None,
            "pre_tokenizer": pre,
            "post_processor": post,
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {
                "type": "BPE",
                "dropout": None,
                "unk_token": None,
                "continuing_subword_prefix": None,
                "end_of_word_suffix": None,
                "fuse_unk": False,
                "byte_fallback": False,
                "ignore_merges": self.ignore_merges,
                "vocab": dict(sorted(self.vocab.items(), key=lambda kv: kv[1])),
                "merges": [f"{a} {b}" for a, b in self.merges],
            },
        }

    def save(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.to_json(), f, ensure_ascii=False, indent=1)
            f.write("\n")

    @classmethod
    def from_json(cls, data: dict, source: str = "tokenizer.json") -> "ByteLevelBPE":
        model = data.get("model") or {}
        if model.get("type") != "BPE":
            raise TokenizerError(f"{source}: model type {model.get('type')!r} is not BPE")
        if model.get("byte_fallback"):
            raise TokenizerError(f"{source}: byte_fallback BPE (SentencePiece style) is not supported")
        pre = data.get("pre_tokenizer") or {}
        pretok = _detect_pretokenizer(pre, source)
        merges = []
        for m in model.get("merges", []):
            pair = m.split(" ") if isinstance(m, str) else list(m)
            if len(pair) != 2:
                raise TokenizerError(f"{source}: malformed merge {m!r}")
            merges.append((pair[0], pair[1]))
        added = {t["content"]: int(t["id"]) for t in data.get("added_tokens", [])}
        bos, add_bos = None, False
        post = data.get("post_processor") or {}
        if post.get("type") == "TemplateProcessing":
            single = post.get("single", [])
            if single and "SpecialToken" in single[0]:
                bos, add_bos = single[0]["SpecialToken"]["id"], True
        return cls(
            model["vocab"],
            merges,
            added,
            pretok,
            bos_token=bos,
            add_bos=add_bos,
            ignore_merges=bool(model.get("ignore_merges", False)),
        )

    @classmethod
    def load(cls, path: str) -> "ByteLevelBPE":
        if os.path.isdir(path):
            path = os.path.join(path, "tokenizer.json")
        with open(path, encoding="utf-8") as f:
            return cls.from_json(json.load(f), path)


def _detect_pretokenizer(pre: dict, source: str) -> str:
    if pre.get("type") == "ByteLevel" and pre.get("use_regex", True):
        return "gpt2"
    if pre.get("type") == "Sequence":
        parts = pre.get("pretokenizers", [])
        if (
            len(parts) == 2
            and parts[0].get("type") == "Split"
            and parts[0].get("pattern", {}).get("Regex") == LLAMA3_PATTERN
            and parts[1].get("type") == "ByteLevel"
        ):
            return "llama3"
    raise TokenizerError(f"{source}: unsupported pre_tokenizer {json.dumps(pre)[:200]}")


_CORPUS_PATH = os.path.join(os.path.dirname(__file__), "data", "corpus.txt")


def corpus_text() -> str:
    """A small English corpus (original text) for training generic tokenizers."""
    with open(_CORPUS_PATH, encoding="utf-8") as f:
        return f.read()
