#!/usr/bin/python3
"""Writes the test vectors of tests/unit/runtime/tokenizer_test.cc.

Usage: gen_tokenizer_vectors.py OUTPUT_DIR

Trains byte-level BPE tokenizers with the Python reference
(tests/models/kiln_models/tokenizer.py) and records, for each, the tokenizer itself and
what the reference answers for a few hundred strings and id sequences. The C++
tokenizer must give the same answers. Deterministic: the same files every run.

Files (line-based text, fields separated by one space, strings as lowercase hex of
their UTF-8 bytes, "-" for an empty string or an empty id list, id lists as
comma-separated decimals):

  manifest.txt      one tokenizer name a line
  <name>.txt        kiln-tokenizer-vectors 1
                    pretokenizer gpt2|llama3
                    pattern HEX            (the pre-tokenizer's regex, as in tokenizer.json)
                    vocab_size N           (max id + 1)
                    bos_id ID              (-1: none)
                    add_bos 0|1
                    ignore_merges 0|1
                    vocab ID HEX           (byte-level form; ids not listed are "")
                    merge LEFT_ID RIGHT_ID (in rank order)
                    added ID SPECIAL HEX
                    encode ADD_SPECIAL TEXT_HEX IDS
                    decode SKIP_SPECIAL IDS TEXT_HEX
                    decode_error IDS       (the reference rejects these ids)
  utf8.txt          utf8 BYTES_HEX VALID COMPLETE REPLACED_HEX
                    VALID: bytes.decode("utf-8") succeeds; COMPLETE: length without a
                    trailing proper prefix of a well-formed character (what a streaming
                    decoder must hold back);
                    REPLACED: bytes.decode("utf-8", errors="replace")

Needs only the standard library and python3-regex; run with /usr/bin/python3.
"""

from __future__ import annotations

import os
import random
import sys
import unicodedata
from typing import Dict, List, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "models"))

import regex  # noqa: E402

from kiln_models.tokenizer import (  # noqa: E402
    BYTE_TO_CHAR,
    PATTERNS,
    ByteLevelBPE,
    TokenizerError,
    _to_symbols,
    corpus_text,
)

# Text beyond the English corpus, so that merges also form inside multi-byte
# characters, numbers, code and contractions.
EXTRA_TEXT = """\
Don't worry: it's fine, we're done, they've left, I'm here, you'll see, he'd know.
DON'T SHOUT. IT'S LOUD. WE'RE HERE. THEY'VE GONE. I'M OK. YOU'LL SEE. HE'D GO.
The café serves crème brûlée and a naïve piñata; Ünïcödé façade, déjà vu, Zürich, São Paulo.
日本語のテキストを少し書きます。東京は大きな都市です。日本語の文章です。
中文分词测试：我们今天去公园散步。中文的句子。
안녕하세요, 만나서 반갑습니다. 한국어 문장입니다.
Привет, как дела? Это тест. Ελληνικά γράμματα. مرحبا بالعالم. שלום עולם. สวัสดีครับ नमस्ते दुनिया
Emoji: 👍 🎉🎉 😀😀😀 ❤️ 👨‍👩‍👧 🇯🇵 ✅ — done.
Numbers: 0 1 12 123 1234 12345 123456 2024-06-01 3.14159 1,000,000 $19.99 50% 7th 21st.
def install(part, screws=4):
    if part.is_cold():
        return tighten(part, screws)
    return None

for (int i = 0; i < n; ++i) { total += values[i] * 2; }
<div class="cover">Lift &amp; remove</div>
    Indented    text\twith\ttabs and  double  spaces.
Windows line\r\nendings\r\nhere.\r\n
U+180E is not White_Space since Unicode 6.3 (Python, Oniguruma and the runtime agree; PCRE2's \\s differs):
a!\u180e!b a!\u180e!b a!\u180e!b ..\u180e.. ..\u180e.. x\u180e\u180e y x\u180e\u180e y
"""

GPT2_SPECIALS = {"<|endoftext|>": 5, "<|im_start|>": 300, "<|im_end|>": 301, "<image>": 4000}
GPT2_BOS_SPECIALS = ["<s>", "</s>", "<image>", "<image><image>", "<pad>"]
LLAMA3_SPECIALS = {
    "<|begin_of_text|>": 0,
    "<|end_of_text|>": 1,
    "<|start_header_id|>": 1500,
    "<|end_header_id|>": 1501,
    "<|eot_id|>": 1502,
    "<|image|>": 3000,
}


def train_tokenizers() -> Dict[str, ByteLevelBPE]:
    texts = [corpus_text(), EXTRA_TEXT]
    toks: Dict[str, ByteLevelBPE] = {}

    gpt2 = ByteLevelBPE.train(texts, 640, special_tokens=GPT2_SPECIALS, pretokenizer="gpt2")
    # GPT-2 itself has <|endoftext|> both as an added token and in the model vocabulary,
    # at the same id: the C++ spec then has vocab[id] == content.
    vocab = dict(gpt2.vocab)
    vocab["<|endoftext|>"] = GPT2_SPECIALS["<|endoftext|>"]
    toks["gpt2"] = ByteLevelBPE(vocab, gpt2.merges, gpt2.added_tokens, "gpt2")

    toks["gpt2_bos"] = ByteLevelBPE.train(
        texts, 560, special_tokens=GPT2_BOS_SPECIALS, pretokenizer="gpt2", bos_token="<s>", add_bos=True
    )

    llama3 = ByteLevelBPE.train(
        texts,
        720,
        special_tokens=LLAMA3_SPECIALS,
        pretokenizer="llama3",
        bos_token="<|begin_of_text|>",
        add_bos=True,
    )
    toks["llama3"] = llama3

    # ignore_merges (Llama-3's tokenizer.json sets it): whole pre-tokens that are in the
    # vocabulary are emitted as is. Add words the merges would split differently.
    vocab = dict(llama3.vocab)
    next_id = llama3.max_id + 1
    for word in [" bracket", " cabinet", " screws", "Hello", " wall", " café", "日本語", " the",
                 " breaker", "install", "\n\n", "    ", "!!!", "123"]:
        sym = _to_symbols(word)
        if sym not in vocab:
            vocab[sym] = next_id
            next_id += 1
    toks["llama3_ignore"] = ByteLevelBPE(
        vocab, llama3.merges, llama3.added_tokens, "llama3", ignore_merges=True
    )

    toks["handmade"] = handmade_tokenizer()
    return toks


def handmade_tokenizer() -> ByteLevelBPE:
    """Merges in an order no trainer produces: a merge whose operand is made by a later
    merge, two merges making the same token, a pair listed twice. tokenizer.py's order
    (all occurrences of the lowest-ranked pair, then the next) decides."""
    vocab = {BYTE_TO_CHAR[b]: b for b in range(256)}
    merges = [
        ("ab", "a"),  # uses "ab" before (a, b) makes it
        ("a", "b"),
        ("b", "c"),
        ("a", "bc"),
        ("ab", "c"),  # "abc" a second way
        ("a", "a"),
        ("aa", "a"),
        ("c", "c"),
        ("cc", "cc"),
        ("Ġ", "a"),
        ("Ġ", "Ġ"),
        ("ĠĠ", "ĠĠ"),
        ("c", "c"),  # listed again: the later rank counts
    ]
    for a, b in merges:
        if a + b not in vocab:
            vocab[a + b] = len(vocab)
    added = {"<x>": len(vocab), "<x><y>": len(vocab) + 1}
    return ByteLevelBPE(vocab, merges, added, "gpt2")


# ---------------------------------------------------------------------------- strings

SPECIAL_STRINGS = sorted(
    set(GPT2_SPECIALS) | set(GPT2_BOS_SPECIALS) | set(LLAMA3_SPECIALS) | {"<x>", "<x><y>"}
)

FIXED_STRINGS: List[str] = [
    # empty and whitespace
    "", " ", "  ", "   ", "\t", "\n", "\r\n", " \n ", "\n\n\n", "\r\n\r\n", "\r", "\r\r\n",
    "  hello", "hello  ", "  hello  ", "\thello\t", "\nhello\n", " \t \n x", "a \t b",
    "foo  \n  bar", "line1\r\nline2\r\n", "line1\r\n\r\nline2", "   \n   ", "\t\tindent",
    "x\n \n y", "end with spaces   ", "   \n", "\n   ",
    # ASCII and punctuation
    "Hello", "Hello world", "Hello, world!", "How do I install this part?",
    "The quick brown fox jumps over the lazy dog.", "!!!???", "...", "--", "a-b_c",
    "(parenthesis) [brackets] {braces}", "\"quoted\" 'single'", "#hashtag @mention",
    "path/to/file.txt", "https://example.com/a?b=c&d=e#f", "user@example.com",
    "x+y=z; a*b/c", "~`!@#$%^&*()_+-={}|[]\\:\";'<>?,./", "a.b.c", " ,", ", ", " .",
    # numbers
    "0", "12", "123", "1234", "12345", "123456", "1234567", "3.14159", "1,000,000",
    "$19.99", "50%", "2024-06-01", "7th 21st", "abc123def", "x2", " 42", "  42",
    "٣٤٥", "½ ¾", "Ⅻ", "x² + y³", "1 2 3", "10000000000000000",
    # contractions
    "don't", "I'm", "we're", "they've", "she'll", "he'd", "it's", "'s", "''s", "'t",
    "DON'T", "I'M", "WE'RE", "THEY'VE", "SHE'LL", "HE'D", "IT'S", "It'S", "We'Re",
    "y'all", "rock'n'roll", "'ſ", "it'ſ", " 's", "'sup", "o'clock", "'", "''", "' ",
    "'ll've", "'RE'Ve",
    # accents, scripts, combining marks
    "café", "naïve", "crème brûlée", "Ünïcödé", "ñ", "Zürich", "São Paulo",
    "e\u0301", "a\u0300\u0301\u0302", "\u0301", " \u0301", "n\u0303o", "\u0301abc",
    "日本語のテキスト", "中文分词测试", "안녕하세요", "Привет, мир", "Ελληνικά",
    "مرحبا بالعالم", "שלום", "สวัสดีครับ", "नमस्ते दुनिया", "ǅ ǈ",
    # emoji and symbols
    "👍", "🎉🎉", "😀😀😀", "❤️", "👨‍👩‍👧", "🇯🇵", "✅ done", "a👍b", " 👍 ", "€100",
    "“quoted”", "«guillemets»", "—", "…", "™®©",
    # unusual spaces and controls
    "a\u00a0b", "a\u2003b", "a\u3000b", "a\u180eb", "a\u0085b", "a\x0bb", "a\x0cb",
    "a\x1cb", "a\u200bb", "\ufeffBOM", "nul\x00byte", "\u2028\u2029", " \u00a0 ",
    "\u3000\u3000x", "x\u180e\u180e ", "a!\u180e!b", "..\u180e..", "x\u180e\u180e y",
    "\x7f\x01\x02",
    # code
    "def f(x):\n    return x**2\n", "if (a && b) { c++; }", "<div class=\"x\">&amp;</div>",
    "    indented\n        more\n", "\tx = 1\n\ty = 2\n",
    # special tokens
    "<|endoftext|>", "Hello<|endoftext|>world", "<|endoftext|><|endoftext|>",
    " <|endoftext|> ", "<|endoftext|", "<|endoftext", "|endoftext|>",
    "<s>hi</s>", "<s><s>", "<<s>>", "</s></s>", "<image>", "<image><image>",
    "<image><image><image>", " <image> ", "<image", "<imag", "a<pad>b",
    "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\n",
    "<|image|><|image|>What is this?", "text <|eot_id|>", "<x><y><x>", "<x><x><y>",
    "<|end_of_text|>\n", "<s> </s>",
    # handmade tokenizer's alphabet
    "abab", "ababa", "abcabc", "aaaa", "aaaaa", "cccc", "ccccc", "abc abc", "a a a",
    "bcbc", "cabca", "  a", "      ",
    # long inputs
    " " * 10000, "a" * 5000, "\n" * 3000, "pneumonoultramicroscopicsilicovolcanoconiosis" * 200,
    "1234567890" * 500, "ab" * 3000, ("word " * 2000).strip(), "x" + " " * 5000 + "y",
    "日本語" * 1000, "👍" * 1000,
]


def random_strings(rng: random.Random, count: int) -> List[str]:
    fragments = [
        "the", "part", "install", "Hello", "screw", "bracket", " ", "  ", "\t", "\n", "\r\n",
        ",", ".", "!", "?", "'s", "'T", "'re", "'", "\"", "-", "(", ")", "0", "7", "42", "123",
        "9999", "é", "ü", "ñ", "日本", "语", "한", "Ж", "λ", "👍", "🎉", "\u0301", "\u00a0",
        "\u3000", "#", "$", "%", "&", "<", ">", "|", "ab", "abc", "cc", "a",
    ] + SPECIAL_STRINGS
    out = []
    for _ in range(count):
        n = rng.randint(1, 14)
        out.append("".join(rng.choice(fragments) for _ in range(n)))
    return out


def check_unicode_version(strings: Sequence[str]) -> None:
    """The runtime's category table (Unicode 14, scripts/gen_unicode_categories.py) and the
    `regex` module (newer) disagree on characters added to Unicode since 14.0. Test strings must avoid them."""
    letter = regex.compile(r"\p{L}")
    number = regex.compile(r"\p{N}")
    for s in strings:
        for c in set(s):
            cat = unicodedata.category(c)
            if bool(letter.match(c)) != cat.startswith("L") or bool(number.match(c)) != cat.startswith("N"):
                raise SystemExit(f"test string uses U+{ord(c):04X}, whose class differs across Unicode versions")


# ---------------------------------------------------------------------------- writing


def hexs(data: bytes) -> str:
    return data.hex() if data else "-"


def ids_field(ids: Sequence[int]) -> str:
    return ",".join(str(i) for i in ids) if ids else "-"


def write_tokenizer(path: str, tok: ByteLevelBPE, strings: Sequence[str], rng: random.Random) -> int:
    lines: List[str] = ["kiln-tokenizer-vectors 1"]
    vocab_size = tok.max_id + 1
    bos_id = tok.added_tokens[tok.bos_token] if tok.bos_token is not None else -1
    lines += [
        f"pretokenizer {tok.pretokenizer}",
        f"vocab_size {vocab_size}",
        f"bos_id {bos_id}",
        f"add_bos {int(tok.add_bos)}",
        f"ignore_merges {int(tok.ignore_merges)}",
        f"pattern {hexs(PATTERNS[tok.pretokenizer].encode('utf-8'))}",
    ]
    for t, i in sorted(tok.vocab.items(), key=lambda kv: kv[1]):
        lines.append(f"vocab {i} {hexs(t.encode('utf-8'))}")
    for a, b in tok.merges:
        lines.append(f"merge {tok.vocab[a]} {tok.vocab[b]}")
    for t, i in sorted(tok.added_tokens.items(), key=lambda kv: kv[1]):
        lines.append(f"added {i} 1 {hexs(t.encode('utf-8'))}")

    cases = 0
    for s in strings:
        for add_special in (False, True):
            ids = tok.encode(s, add_special_tokens=add_special)
            lines.append(f"encode {int(add_special)} {hexs(s.encode('utf-8'))} {ids_field(ids)}")
            cases += 1
        ids = tok.encode(s)
        for skip in (False, True):
            text = tok.decode(ids, skip_special_tokens=skip)
            if not skip:
                assert text == s, (s, text)
            lines.append(f"decode {int(skip)} {ids_field(ids)} {hexs(text.encode('utf-8'))}")
            cases += 1

    # Arbitrary id sequences: byte tokens of UTF-8 lead and continuation bytes, added
    # tokens and merged tokens, so that characters are cut in half.
    valid_ids = sorted(tok.id_to_token)
    high_bytes = [tok.vocab[BYTE_TO_CHAR[b]] for b in range(0x80, 0x100)]
    added_ids = sorted(tok.added_tokens.values())
    for _ in range(150):
        seq = []
        for _ in range(rng.randint(1, 12)):
            r = rng.random()
            if r < 0.5:
                seq.append(rng.choice(high_bytes))
            elif r < 0.6:
                seq.append(rng.choice(added_ids))
            else:
                seq.append(rng.choice(valid_ids))
        for skip in (False, True):
            text = tok.decode(seq, skip_special_tokens=skip)
            lines.append(f"decode {int(skip)} {ids_field(seq)} {hexs(text.encode('utf-8'))}")
            cases += 1
    # A 4-byte character fed one byte token at a time, and cut short.
    emoji = "👍".encode("utf-8")
    byte_ids = [tok.vocab[BYTE_TO_CHAR[b]] for b in emoji]
    for cut in range(1, 5):
        seq = byte_ids[:cut] + [tok.vocab[BYTE_TO_CHAR[ord("x")]]]
        lines.append(f"decode 0 {ids_field(seq)} {hexs(tok.decode(seq).encode('utf-8'))}")
        cases += 1

    # Ids the reference rejects.
    unused = [i for i in range(vocab_size) if i not in tok.id_to_token]
    bad_lists = [[-1], [vocab_size], [vocab_size + 1000], [valid_ids[0], -5], [2**31 - 1]]
    if unused:
        bad_lists.append([unused[0]])
        bad_lists.append([valid_ids[1], unused[-1]])
    for seq in bad_lists:
        try:
            tok.decode(seq)
        except TokenizerError:
            lines.append(f"decode_error {ids_field(seq)}")
            cases += 1
        else:
            raise SystemExit(f"reference accepted ids {seq}")

    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    return cases


def write_utf8(path: str, rng: random.Random) -> int:
    samples: List[bytes] = [b""]
    samples += [bytes([b]) for b in range(256)]
    interesting = [0x00, 0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xC1, 0xC2, 0xDF,
                   0xE0, 0xE1, 0xEC, 0xED, 0xEE, 0xEF, 0xF0, 0xF1, 0xF3, 0xF4, 0xF5, 0xFF]
    samples += [bytes([a, b]) for a in interesting for b in interesting]
    lead = [0xE0, 0xE1, 0xED, 0xEF, 0xF0, 0xF1, 0xF4]
    cont = [0x41, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0]
    samples += [bytes([a, b, c]) for a in lead for b in cont for c in cont]
    samples += [bytes([a, b, c, d]) for a in (0xF0, 0xF4, 0xF5) for b in cont for c in (0x80, 0xBF, 0x41)
                for d in (0x80, 0xBF, 0x41)]
    pool = list(range(0x80, 0x100)) + [0x41, 0x20] + list(b"\xe6\x97\xa5\xf0\x9f\x91\x8d\xc3\xa9")
    for _ in range(3000):
        samples.append(bytes(rng.choice(pool) for _ in range(rng.randint(1, 10))))
    samples += ["héllo 日本 👍".encode("utf-8"), "👍".encode("utf-8")[:3], "日".encode("utf-8")[:2]]

    # Proper prefixes of well-formed characters: what a streaming decoder holds back.
    # (CPython's incremental decoder also holds back b"\xed\xa0".."\xed\xbf", which can
    # never complete, as surrogates are excluded; the text is the same either way.)
    prefixes = set()
    for cp in range(0x80, 0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        enc = chr(cp).encode("utf-8")
        for k in range(1, len(enc)):
            prefixes.add(enc[:k])

    lines = []
    for data in samples:
        try:
            data.decode("utf-8")
            valid = 1
        except UnicodeDecodeError:
            valid = 0
        complete = len(data)
        for k in (1, 2, 3):
            if k <= len(data) and data[-k:] in prefixes:
                complete = len(data) - k
        replaced = data.decode("utf-8", errors="replace").encode("utf-8")
        lines.append(f"utf8 {hexs(data)} {valid} {complete} {hexs(replaced)}")
    with open(path, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    return len(lines)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    out_dir = argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rng = random.Random(20240601)
    strings = list(FIXED_STRINGS) + random_strings(rng, 120)
    extra = [EXTRA_TEXT, corpus_text(), corpus_text() * 3]
    strings += extra
    check_unicode_version(strings)

    toks = train_tokenizers()
    handmade_strings = ["".join(rng.choice("abc  <x>y") for _ in range(rng.randint(1, 60))) for _ in range(150)]
    total = 0
    for name, tok in toks.items():
        case_strings = strings + (handmade_strings if name == "handmade" else [])
        n = write_tokenizer(os.path.join(out_dir, f"{name}.txt"), tok, case_strings, random.Random(name))
        total += n
    total += write_utf8(os.path.join(out_dir, "utf8.txt"), rng)
    # The manifest last: its presence says the set is complete.
    with open(os.path.join(out_dir, "manifest.txt"), "w", encoding="ascii") as f:
        f.write("\n".join(toks) + "\n")
    print(f"wrote {len(toks)} tokenizers, {len(strings)} strings, {total} cases to {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
