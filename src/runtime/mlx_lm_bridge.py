# mlx_lm_bridge.py - the child process of lmx's mlx_lm backend (src/runtime/bridge.c embeds this
# file at build time and runs it with Python).  It loads a model with mlx-lm and generates on request.
#
# Protocol: JSON Lines on stdin (requests) and stdout (replies), one object per line, flushed after
# every line.  Requests carry "op":
#   {"op": "load", "path": DIR, "adapter": DIR or null}
#   {"op": "generate", "prompt": TEXT} or {"op": "generate", "ids": [..]}, plus generation fields
#   {"op": "chat", "messages": [{"role": .., "content": ..}, ..]}, plus generation fields
#   {"op": "cancel"}   (during a generation: finish it with "cancelled")
#   {"op": "quit"}
# Generation fields: max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed,
# stop_ids [..], stop_strings [..], ignore_eos.
# Replies carry "type":
#   {"type": "token", "id": N, "text": TEXT}   (id -1: text held back until the end, no token)
#   {"type": "done", "finish": "eos"|"stop_token"|"stop_string"|"length"|"cancelled",
#    "finish_id": N or -1, "prompt_tokens": N, "generated_tokens": N}   (load: "done" with "info")
#   {"type": "error", "message": TEXT, "missing": PACKAGE (only when a package is missing)}
# One request runs at a time (lmx sends the next only after the done or error of the last); cancel
# and quit are read while a generation runs.  Anything that is not a JSON object is an error reply.
import json
import queue
import sys
import threading
import traceback

_out = sys.stdout


def send(obj):
    _out.write(json.dumps(obj) + "\n")
    _out.flush()


def fail(msg, **extra):
    d = {"type": "error", "message": msg}
    d.update(extra)
    send(d)


try:
    import mlx.core as mx
except ImportError as e:  # the parent names what to install
    fail("cannot import mlx: %s" % e, missing="mlx")
    sys.exit(3)
try:
    import mlx_lm  # noqa: F401
    from mlx_lm.generate import generate_step
    from mlx_lm.utils import load_model
except ImportError as e:
    fail("cannot import mlx_lm: %s" % e, missing="mlx-lm")
    sys.exit(3)


class Bridge:
    def __init__(self):
        self.model = None
        self.tokenizer = None
        self.eos = set()
        self.requests = queue.Queue()
        self.cancel = threading.Event()

    # ---- reading: a thread so that cancel arrives while a generation runs ----
    def reader(self):
        for line in sys.stdin:
            line = line.strip()
            if not line:
                continue
            try:
                req = json.loads(line)
                if not isinstance(req, dict):
                    raise ValueError("not an object")
            except ValueError as e:
                req = {"op": "_bad", "message": "malformed request: %s" % e}
            op = req.get("op")
            if op == "cancel":
                self.cancel.set()
                continue
            if op == "quit":
                self.cancel.set()
            self.requests.put(req)
        self.cancel.set()
        self.requests.put({"op": "quit"})

    def load(self, req):
        from pathlib import Path

        path = Path(req["path"])
        model, config = load_model(path)
        adapter = req.get("adapter")
        if adapter:
            from mlx_lm.tuner.utils import load_adapters

            model = load_adapters(model, adapter)
        model.eval()
        self.model = model
        eos = config.get("eos_token_id")
        if eos is None:
            eos = []
        self.eos = set(eos if isinstance(eos, list) else [eos])
        self.tokenizer = None  # a model without a tokenizer still generates from ids
        files = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "vocab.json")
        if any((path / f).exists() for f in files):  # (without them transformers makes an empty one)
            try:
                from mlx_lm.utils import load_tokenizer

                self.tokenizer = load_tokenizer(path, eos_token_ids=list(self.eos) or None)
                self.eos |= set(getattr(self.tokenizer, "eos_token_ids", None) or [])
            except Exception:
                self.tokenizer = None
        text_cfg = config.get("text_config") or {}
        get = lambda k, d=0: config.get(k, text_cfg.get(k, d))
        dtype = "mlx"
        if "quantization" in config:
            dtype = "q%d" % config["quantization"].get("bits", 4)
        else:
            dt = str(get("torch_dtype", "") or get("dtype", ""))
            dtype = {"bfloat16": "bf16", "float16": "f16", "float32": "f32"}.get(dt, dtype)
        nparams = 0
        try:
            from mlx.utils import tree_flatten

            nparams = sum(v.size for _, v in tree_flatten(model.parameters()))
        except Exception:
            pass
        bos = get("bos_token_id", -1)
        send({"type": "done", "info": {
            "architecture": str(config.get("model_type", "unknown")),
            "dtype": dtype,
            "n_layers": int(get("num_hidden_layers")), "hidden_size": int(get("hidden_size")),
            "n_heads": int(get("num_attention_heads")), "n_kv_heads": int(get("num_key_value_heads", get("num_attention_heads"))),
            "head_dim": int(get("head_dim", 0) or 0), "ffn_size": int(get("intermediate_size")),
            "vocab_size": int(get("vocab_size")), "max_context": int(get("max_position_embeddings")),
            "n_params": int(nparams), "eos_ids": sorted(int(e) for e in self.eos)[:8],
            "bos_id": int(bos) if isinstance(bos, int) else -1,
            "tokenizer": self.tokenizer is not None,
            "mlx_lm_version": getattr(mlx_lm, "__version__", "?"),
        }})

    def sampler(self, req):
        temp = float(req.get("temperature", 0.0))
        if temp <= 0:
            return lambda x: mx.argmax(x, axis=-1)
        from mlx_lm.sample_utils import make_sampler

        kw = dict(temp=temp, top_p=float(req.get("top_p", 1.0)), min_p=float(req.get("min_p", 0.0)),
                  top_k=int(req.get("top_k", 0)))
        try:
            return make_sampler(**kw)
        except TypeError:  # older mlx-lm without top_k
            kw.pop("top_k")
            return make_sampler(**kw)

    def processors(self, req):
        rp = float(req.get("repetition_penalty", 1.0))
        if rp == 1.0:
            return None
        from mlx_lm.sample_utils import make_logits_processors

        return make_logits_processors(repetition_penalty=rp, repetition_context_size=int(req.get("penalty_last_n", 64)))

    def generate(self, req, ids):
        self.cancel.clear()
        if int(req.get("seed", -1)) >= 0:
            mx.random.seed(int(req["seed"]))
        max_tokens = int(req.get("max_tokens", 256))
        stops = set(int(i) for i in req.get("stop_ids") or [])
        eos = set() if req.get("ignore_eos") else self.eos
        stop_strings = [s for s in (req.get("stop_strings") or []) if s]
        detok = self.tokenizer.detokenizer if self.tokenizer is not None else None
        if detok is not None:
            detok.reset()
        held = ""  # decoded text held back: it may begin a stop string
        n, finish, finish_id = 0, "length", -1
        if max_tokens <= 0:
            send({"type": "done", "finish": "length", "finish_id": -1, "prompt_tokens": len(ids), "generated_tokens": 0})
            return
        steps = generate_step(mx.array(ids, dtype=mx.uint32), self.model, max_tokens=max_tokens,
                              sampler=self.sampler(req), logits_processors=self.processors(req))
        for tok, _ in steps:
            tok = int(tok.item() if hasattr(tok, "item") else tok)
            if self.cancel.is_set():
                finish = "cancelled"
                break
            if tok in eos or tok in stops:
                finish, finish_id = ("eos" if tok in eos else "stop_token"), tok
                break
            text = ""
            if detok is not None:
                detok.add_token(tok)
                text = held + detok.last_segment
                held = ""
                hit = min((text.find(s) for s in stop_strings if s in text), default=-1)
                if hit >= 0:
                    send({"type": "token", "id": tok, "text": text[:hit]})
                    n += 1
                    finish = "stop_string"
                    break
                # hold back a tail that may be the start of a stop string
                keep = 0
                for s in stop_strings:
                    for k in range(min(len(s) - 1, len(text)), 0, -1):
                        if text.endswith(s[:k]):
                            keep = max(keep, k)
                            break
                if keep:
                    text, held = text[:-keep], text[-keep:]
            send({"type": "token", "id": tok, "text": text})
            n += 1
            if n >= max_tokens:
                break
        if self.cancel.is_set() and finish == "length" and n < max_tokens:
            finish = "cancelled"
        if detok is not None and finish in ("length", "eos", "stop_token"):
            detok.finalize()  # text held back (an incomplete character, a possible stop string)
            rest = held + detok.last_segment
            if rest:
                send({"type": "token", "id": -1, "text": rest})
        send({"type": "done", "finish": finish, "finish_id": finish_id, "prompt_tokens": len(ids),
              "generated_tokens": n})

    def serve(self):
        threading.Thread(target=self.reader, daemon=True).start()
        while True:
            req = self.requests.get()
            op = req.get("op")
            try:
                if op == "quit":
                    return
                elif op == "_bad":
                    fail(req["message"])
                elif op == "load":
                    self.load(req)
                elif self.model is None:
                    fail("no model is loaded")
                elif op in ("generate", "chat"):
                    if op == "chat" or "prompt" in req:
                        if self.tokenizer is None:
                            fail("the model has no tokenizer: generate from token ids")
                            continue
                        if op == "chat":
                            ids = self.tokenizer.apply_chat_template(req["messages"], add_generation_prompt=True)
                            if isinstance(ids, str):
                                ids = self.tokenizer.encode(ids, add_special_tokens=False)
                        else:
                            ids = self.tokenizer.encode(req["prompt"])
                    else:
                        ids = [int(i) for i in req.get("ids") or []]
                    if not ids:
                        fail("the prompt is empty")
                        continue
                    self.generate(req, list(ids))
                else:
                    fail("unknown op %r" % op)
            except Exception as e:
                fail("%s: %s" % (type(e).__name__, e), trace=traceback.format_exc()[-2000:])


if __name__ == "__main__":
    Bridge().serve()
