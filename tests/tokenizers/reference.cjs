// The reference tokenizer for tests/e2e/test_tokenizer_fidelity.py: Hugging Face
// tokenizers (JavaScript) on a tokenizer.json. Reads {"tokenizer": PATH, "config":
// PATH|null, "texts": [...]} on stdin; writes one JSON object per text:
// {"ids": [...] (no special tokens added), "decoded": text of those ids (the
// tokenizer.json decoder alone: no clean-up of spaces before punctuation, which
// transformers applies when tokenizer_config.json asks for it)}.
const fs = require("fs");
const { Tokenizer } = require("@huggingface/tokenizers");

const request = JSON.parse(fs.readFileSync(0, "utf8"));
const json = JSON.parse(fs.readFileSync(request.tokenizer, "utf8"));
const config = request.config ? JSON.parse(fs.readFileSync(request.config, "utf8")) : {};
const tokenizer = new Tokenizer(json, config);
const out = [];
for (const text of request.texts) {
  const ids = tokenizer.encode(text, { add_special_tokens: false }).ids;
  out.push({ ids, decoded: ids.length ? tokenizer.decode(ids, { skip_special_tokens: false, clean_up_tokenization_spaces: false }) : "" });
}
process.stdout.write(JSON.stringify(out));
