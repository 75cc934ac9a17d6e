"""Grouped-query heads, sliding windows and packed documents (issue 21) in the attention protocol, the model
and the trainer, on the CPU.

The oracle is a loop over (batch, query head, query) that lists the visible keys by the definitions of the
issue (query head h reads key/value head h // (Hq // Hkv); query i sees key j where i - left <= j <= i + right,
j <= i under causality, and equal document ids), in fp64: fp64 backends agree with it to rounding (~1e-15;
the default tolerances of ``assert_close`` for fp64 are 1e-7 relative). Model tests run fp64 weights; RoPE's
tables are fp32 (cos / sin rounded to ~6e-8 relative), which bounds the agreement of computations that rotate
at different absolute positions (a document alone vs packed) to ~1e-6 on O(1) logits: tolerance 1e-5.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from cs336_basics.attention import (
    attention_mask,
    check_attention_args,
    get_attention_backend,
    register_attention_backend,
    supports_attention_extras,
)
from cs336_basics.data import document_ids
from cs336_basics.model import BasicsTransformerLM, CausalMultiHeadSelfAttention, TransformerBlock
from cs336_basics.nn_utils import cross_entropy
from cs336_systems.bench.checkpointing import apply_activation_checkpointing
from cs336_systems.cli import main
from cs336_systems.configs import ModelConfig, count_parameters, get_preset
from cs336_systems.train import TokenBatches, TrainConfig, train

F64 = torch.float64
QUIET = lambda s: None
TINY = dict(vocab_size=37, context_length=32, d_model=24, num_layers=2, num_heads=6, d_ff=40)


def visible(i: int, j: int, b: int, is_causal: bool, window, doc_ids) -> bool:
    if is_causal and j > i:
        return False
    if window is not None and not (i - window[0] <= j <= i + window[1]):
        return False
    return doc_ids is None or bool(doc_ids[b, i] == doc_ids[b, j])


def loop_attention(q, k, v, is_causal, window=None, doc_ids=None):
    """The issue's definitions, one (batch, head, query) at a time; differentiable, in q's dtype."""
    B, hq, nq, d = q.shape
    group = hq // k.shape[1]
    rows = []
    for b in range(B):
        heads = []
        for h in range(hq):
            outs = []
            for i in range(nq):
                keys = [j for j in range(k.shape[2]) if visible(i, j, b, is_causal, window, doc_ids)]
                kk, vv = k[b, h // group, keys], v[b, h // group, keys]
                outs.append(torch.softmax(kk @ q[b, h, i] / math.sqrt(d), dim=0) @ vv)
            heads.append(torch.stack(outs))
        rows.append(torch.stack(heads))
    return torch.stack(rows)


def random_doc_ids(B: int, T: int, gen: torch.Generator) -> torch.Tensor:
    """Uneven document lengths per row (boundaries at random positions, at least one document of length 1)."""
    ids = torch.zeros(B, T, dtype=torch.int64)
    for b in range(B):
        cuts = torch.randperm(T - 1, generator=gen)[:3].add(1).tolist()
        cuts = sorted({*cuts, T - 1})  # the last token alone: a one-token document
        for c in cuts:
            ids[b, c:] += 1
    return ids


# -- the protocol: mask helper and the reference / sdpa backends -------------------------------------------------

@pytest.mark.parametrize("nq,nk", [(13, 13), (5, 11), (11, 4)])
def test_attention_mask_is_the_definition(seed, nq, nk):
    gen = torch.Generator().manual_seed(seed)
    doc = random_doc_ids(2, nq, gen) if nq == nk else None
    for is_causal in (False, True):
        for window in (None, (0, 0), (3, 0), (2, 5), (40, 40)):
            mask = attention_mask(nq, nk, is_causal=is_causal, window=window, doc_ids=doc)
            if not is_causal and window is None and doc is None:
                assert mask is None
                continue
            full = mask.expand(2, 1, nq, nk)  # (Nq, Nk), or (B, 1, N, N) with documents
            want = torch.tensor([[[[visible(i, j, b, is_causal, window, doc) for j in range(nk)]
                                   for i in range(nq)]] for b in range(2)])
            assert torch.equal(full, want), (is_causal, window)


CASES = [  # (Hq, Hkv, N, causal, window, with documents)
    (6, 2, 13, True, None, False),  # grouped-query
    (6, 1, 13, True, None, False),  # multi-query
    (6, 6, 13, True, (3, 0), False),  # causal window smaller than the sequence
    (6, 3, 13, False, (2, 4), False),  # two-sided window, grouped
    (6, 2, 13, True, (40, 40), False),  # window larger than the sequence
    (4, 2, 11, True, None, True),  # packed documents
    (6, 2, 13, True, (4, 0), True),  # all three
    (6, 3, 13, False, (1, 2), True),  # non-causal documents and window
]


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("hq,hkv,n,causal,window,docs", CASES)
def test_backends_match_the_definition(seed, backend, hq, hkv, n, causal, window, docs):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, hq, n, 8, dtype=F64, requires_grad=True)
    k, v = (torch.randn(2, hkv, n, 8, dtype=F64, requires_grad=True) for _ in range(2))
    doc = random_doc_ids(2, n, gen) if docs else None
    kwargs = {k_: v_ for k_, v_ in dict(window=window, doc_ids=doc).items() if v_ is not None}
    out = get_attention_backend(backend)(q, k, v, causal, **kwargs)
    ref = loop_attention(q, k, v, causal, window, doc)
    torch.testing.assert_close(out, ref)
    do = torch.randn_like(out)
    grads = torch.autograd.grad(out, (q, k, v), do)
    ref_grads = torch.autograd.grad(ref, (q, k, v), do)
    for g, r in zip(grads, ref_grads, strict=True):  # dK, dV sum over the query heads of their group
        torch.testing.assert_close(g, r)


def test_sdpa_keeps_the_causal_fast_path_and_old_calls(seed):
    """Four positional arguments still work (the first protocol), and without extras sdpa is torch's is_causal
    call (enable_gqa for grouped heads), bit for bit."""
    q = torch.randn(2, 4, 9, 8)
    k, v = torch.randn(2, 2, 9, 8), torch.randn(2, 2, 9, 8)
    out = get_attention_backend("sdpa")(q, k, v, True)
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True,
                                                                              enable_gqa=True))
    k4, v4 = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    torch.testing.assert_close(get_attention_backend("reference")(q, k4, v4, True), out, rtol=1e-5, atol=1e-6)


def test_bad_attention_arguments_name_the_problem():
    q, k = torch.randn(2, 6, 5, 8), torch.randn(2, 4, 5, 8)
    for kwargs, needle in (
        (dict(q=q, k=k, v=k), r"query heads \(6\) must be a multiple of key/value heads \(4\)"),
        (dict(window=(-1, 0)), "two non-negative ints"),
        (dict(window=(2,)), "two non-negative ints"),
        (dict(window=(1.5, 0)), "two non-negative ints"),
        (dict(doc_ids=torch.zeros(2, 5)), "doc_ids must be an integer tensor"),
        (dict(doc_ids=torch.zeros(2, 5, dtype=torch.bool)), "doc_ids must be an integer tensor"),
        (dict(doc_ids=torch.zeros(3, 5, dtype=torch.int64)), r"doc_ids must have shape \(batch, N\) = \(2, 5\)"),
        (dict(k=torch.randn(2, 2, 7, 8), v=torch.randn(2, 2, 7, 8), doc_ids=torch.zeros(2, 5, dtype=torch.int64)),
         "Nq=5, Nk=7"),
    ):
        args = dict(q=q, k=q[:, :2], v=q[:, :2]) | kwargs
        with pytest.raises(ValueError, match=needle):
            check_attention_args(args["q"], args["k"], args["v"], args.get("window"), args.get("doc_ids"))
        extras = {n: args[n] for n in ("window", "doc_ids") if n in args}
        for backend in ("reference", "sdpa"):
            with pytest.raises(ValueError, match=needle):
                get_attention_backend(backend)(args["q"], args["k"], args["v"], True, **extras)


# -- the model --------------------------------------------------------------------------------------------------

def old_style_backend(q, k, v, is_causal):
    return get_attention_backend("reference")(q, k, v, is_causal)


register_attention_backend("old_style_test", old_style_backend)  # a backend of the first protocol, by name


def test_protocol_detection_and_old_style_backends(seed):
    assert supports_attention_extras(get_attention_backend("reference"))
    assert supports_attention_extras(lambda q, k, v, c, **kw: q)
    assert not supports_attention_extras(old_style_backend)
    # The default model works with a backend of the first protocol, exactly as the reference backend does.
    torch.manual_seed(seed)
    old = BasicsTransformerLM(**TINY, attention_backend=old_style_backend, dtype=F64)
    torch.manual_seed(seed)
    ref = BasicsTransformerLM(**TINY, dtype=F64)
    x = torch.randint(0, 37, (2, 11))
    assert torch.equal(old(x), ref(x))
    for kwargs in (dict(num_kv_heads=2), dict(attention_window=4)):
        with pytest.raises(ValueError, match="takes only \\(q, k, v, is_causal\\)"):
            BasicsTransformerLM(**TINY, attention_backend=old_style_backend, **kwargs)
    with pytest.raises(ValueError, match="cannot run doc_ids"):
        old(x, doc_ids=torch.zeros_like(x))


def test_defaults_are_the_handout_model_bit_for_bit(seed):
    """num_kv_heads=None and num_kv_heads=num_heads build the same parameters (names, shapes, values from the same
    seed) as before, and the same outputs; attention_window >= T changes nothing."""
    torch.manual_seed(seed)
    default = BasicsTransformerLM(**TINY)
    torch.manual_seed(seed)
    explicit = BasicsTransformerLM(**TINY, num_kv_heads=6, attention_window=11)
    sd, se = default.state_dict(), explicit.state_dict()
    assert list(sd) == list(se) and all(torch.equal(sd[k], se[k]) for k in sd)
    assert sd["layers.0.attn.k_proj.weight"].shape == (24, 24)
    assert sum(p.numel() for p in default.parameters()) == count_parameters(ModelConfig(**TINY))
    x = torch.randint(0, 37, (2, 11))
    for backend in ("reference", "sdpa"):
        torch.manual_seed(seed)
        a = BasicsTransformerLM(**TINY, attention_backend=backend)
        torch.manual_seed(seed)
        b = BasicsTransformerLM(**TINY, attention_backend=backend, num_kv_heads=6, attention_window=11)
        assert torch.equal(a(x), b(x)), backend


@pytest.mark.parametrize("kv", [1, 2, 3])
def test_grouped_query_model_equals_repeated_heads(seed, kv):
    """A model with kv key/value heads equals the full multi-head model whose k / v projections repeat each
    key/value head's rows for the query heads of its group (head h reads h // (H / kv)); the parameter count
    follows count_parameters."""
    gqa = BasicsTransformerLM(**TINY, num_kv_heads=kv, dtype=F64)
    assert gqa.layers[0].attn.k_proj.weight.shape == (kv * 4, 24)
    assert sum(p.numel() for p in gqa.parameters()) == count_parameters(ModelConfig(**TINY, num_kv_heads=kv))
    full = BasicsTransformerLM(**TINY, dtype=F64)
    state = gqa.state_dict()
    for name, w in list(state.items()):
        if name.endswith(("k_proj.weight", "v_proj.weight")):
            state[name] = w.view(kv, 4, 24).repeat_interleave(6 // kv, dim=0).reshape(24, 24)
    full.load_state_dict(state)
    x = torch.randint(0, 37, (2, 13))
    torch.testing.assert_close(gqa(x), full(x))


def banded_backend(width: int):
    """A backend of the second protocol that ignores the model's window and applies keys i-width+1..i itself."""

    def attn(q, k, v, is_causal, *, window=None, doc_ids=None):
        n = q.shape[-2]
        mask = torch.tensor([[0 <= i - j < width for j in range(n)] for i in range(n)])
        return torch.softmax((q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~mask, -math.inf),
                             -1) @ v

    return attn


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("width", [1, 3, 12])
def test_window_is_the_last_w_tokens_itself_included(seed, backend, width):
    torch.manual_seed(seed)
    windowed = BasicsTransformerLM(**TINY, attention_window=width, attention_backend=backend, dtype=F64)
    torch.manual_seed(seed)
    oracle = BasicsTransformerLM(**TINY, attention_backend=banded_backend(width), dtype=F64)
    x = torch.randint(0, 37, (2, 13))
    torch.testing.assert_close(windowed(x), oracle(x))
    # W = 1: each token attends to itself only, so the attention output is its value projection.
    if width == 1:
        attn = windowed.layers[0].attn
        h = torch.randn(2, 13, 24, dtype=F64)
        torch.testing.assert_close(attn(h), attn.output_proj(attn.v_proj(h)))


def run_documents_apart(model, x, doc):
    """Logits of each document run alone (its own positions 0..len-1), placed back at its positions."""
    out = torch.empty(*x.shape, model.vocab_size, dtype=F64)
    for b in range(x.shape[0]):
        for d in doc[b].unique():
            where = (doc[b] == d).nonzero().squeeze(1)
            out[b, where] = model(x[b:b + 1, where])[0]
    return out


@pytest.mark.parametrize("backend", ["reference", "sdpa"])
@pytest.mark.parametrize("extra", [{}, dict(num_kv_heads=2, attention_window=3)])
def test_packed_documents_equal_documents_run_apart(seed, backend, extra):
    gen = torch.Generator().manual_seed(seed)
    model = BasicsTransformerLM(**TINY, attention_backend=backend, dtype=F64, **extra)
    x = torch.randint(0, 37, (2, 17))
    doc = random_doc_ids(2, 17, gen)
    packed = model(x, doc_ids=doc)
    torch.testing.assert_close(packed, run_documents_apart(model, x, doc), rtol=1e-5, atol=1e-5)
    assert not torch.allclose(packed, model(x), rtol=1e-3, atol=1e-3)  # the documents did see each other before


@pytest.mark.parametrize("spec", ["selective", "nested", "1"])
def test_doc_ids_flow_through_activation_checkpointing(seed, spec):
    """Loss and gradients of a model under activation checkpointing with doc_ids equal the plain model's (same
    ops recomputed: fp64, to rounding)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    plain = BasicsTransformerLM(**TINY, num_kv_heads=3, dtype=F64)
    torch.manual_seed(seed)
    wrapped = apply_activation_checkpointing(BasicsTransformerLM(**TINY, num_kv_heads=3, dtype=F64), spec)
    x, y = torch.randint(0, 37, (2, 15)), torch.randint(0, 37, (2, 15))
    doc = random_doc_ids(2, 15, gen)
    losses = []
    for m in (plain, wrapped):
        loss = cross_entropy(m(x, doc_ids=doc), y)
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[0], losses[1])
    g_plain = [p.grad for p in plain.parameters()]
    g_wrapped = [p.grad for p in wrapped.parameters()]
    for a, b in zip(g_plain, g_wrapped, strict=True):
        torch.testing.assert_close(a, b)
    plain.zero_grad()
    cross_entropy(plain(x), y).backward()  # without doc_ids the gradient differs: the ids did reach the blocks
    assert any(not torch.allclose(p.grad, g) for p, g in zip(plain.parameters(), g_wrapped, strict=True))


def test_bad_model_arguments():
    for kwargs, needle in ((dict(num_kv_heads=4), "positive divisor of num_heads \\(6\\)"),
                           (dict(num_kv_heads=0), "positive divisor"), (dict(num_kv_heads=True), "positive divisor"),
                           (dict(attention_window=0), "attention_window must be a positive integer"),
                           (dict(attention_window=2.0), "attention_window must be a positive integer")):
        with pytest.raises(ValueError, match=needle):
            BasicsTransformerLM(**TINY, **kwargs)
        with pytest.raises(ValueError, match=needle):
            CausalMultiHeadSelfAttention(24, 6, **kwargs)
        with pytest.raises(ValueError, match=needle):
            TransformerBlock(24, 6, 40, **kwargs)
        with pytest.raises(ValueError, match=needle.replace("num_heads \\(6\\)", "num_heads")):
            ModelConfig(**TINY, **kwargs)
    model = BasicsTransformerLM(**TINY)
    x = torch.randint(0, 37, (2, 9))
    with pytest.raises(ValueError, match="doc_ids must be an integer tensor"):
        model(x, doc_ids=torch.zeros(2, 9))
    with pytest.raises(ValueError, match="doc_ids must have the shape"):
        model(x, doc_ids=torch.zeros(2, 8, dtype=torch.int64))
    with pytest.raises(ValueError, match="doc_ids must have the shape"):
        model(x[0], doc_ids=torch.zeros(9, dtype=torch.int64))


@pytest.mark.parametrize("name", ["tiny", "small", "xl", "8b"])
def test_presets_build_with_the_new_fields(name):
    cfg = get_preset(name)
    assert cfg.num_kv_heads is None and cfg.attention_window is None
    assert "num_kv_heads" not in cfg.model_kwargs()  # the handout model's arguments as before
    gqa = cfg.replace(num_kv_heads=cfg.num_heads // {"xl": 5}.get(name, 4), attention_window=64)
    model = BasicsTransformerLM(**gqa.model_kwargs(), device="meta")
    assert sum(p.numel() for p in model.parameters()) == count_parameters(gqa) < count_parameters(cfg)


# -- documents from end-of-document tokens, and the trainer ----------------------------------------------------

def test_document_ids_from_eos_tokens(seed):
    eos = 3
    x = torch.tensor([[5, 3, 7, 7, 3, 3, 1], [3, 1, 1, 1, 1, 1, 3]])
    assert document_ids(x, eos).tolist() == [[0, 0, 1, 1, 1, 2, 3], [0, 1, 1, 1, 1, 1, 1]]
    r = torch.randint(0, 6, (4, 29))  # random streams: the definition written as a loop
    ids = document_ids(r, eos)
    for b in range(4):
        current = 0
        for t in range(29):
            assert ids[b, t] == current
            current += int(r[b, t] == eos)  # the EOS token belongs to the document it ends
    with pytest.raises(ValueError, match="integer tensor"):
        document_ids(r.float(), eos)


def packed_file(path, eos: int, seed: int) -> None:
    """Documents of 1..9 tokens from the tiny vocabulary, each ended by eos."""
    rng = np.random.default_rng(seed)
    docs = [np.r_[rng.integers(0, 512, size=rng.integers(0, 9)), eos] for _ in range(600)]
    np.concatenate(docs).astype(np.uint16).tofile(path)


@pytest.mark.parametrize("extra", [{}, dict(loss="fused", activation_checkpointing="selective", num_kv_heads=2,
                                            attention_window=5)])
def test_train_eos_id_masks_documents(tmp_path, seed, extra):
    """The logged step-0 loss is the model's loss on that batch with the doc_ids derived from it (not the loss
    without them); training then runs."""
    path = tmp_path / "docs.bin"
    packed_file(path, eos=511, seed=seed)
    cfg = TrainConfig(preset="tiny", context_length=24, batch_size=3, steps=3, data=str(path), eos_id=511,
                      seed=seed % 1000, **extra)
    summary = train(cfg, log=QUIET)
    assert len(summary["rows"]) == 3 and all(math.isfinite(r["loss"]) for r in summary["rows"])
    torch.manual_seed(cfg.seed)  # the trainer's initialisation
    kv = {k: extra[k] for k in ("num_kv_heads", "attention_window") if k in extra}
    model = BasicsTransformerLM(**get_preset("tiny").model_kwargs(), **kv)
    x, y = TokenBatches(cfg, 512, 24, 3, 0, 1, torch.device("cpu")).get(0, 0)
    with torch.no_grad():
        logits_masked, logits_unmasked = model(x, document_ids(x, 511)), model(x)
        masked = cross_entropy(logits_masked, y).item()
        unmasked = cross_entropy(logits_unmasked, y).item()
    assert (logits_masked - logits_unmasked).abs().max() > 1e-3  # the documents change what the model computes
    logged = summary["rows"][0]["loss"]
    assert logged == pytest.approx(masked, rel=1e-5)
    if abs(masked - unmasked) > 1e-4:  # the two losses of this draw are apart: the log is the masked one
        assert abs(logged - masked) < abs(logged - unmasked)


def test_train_attention_options_reach_the_export(tmp_path):
    export = tmp_path / "w.pt"
    train(TrainConfig(preset="tiny", context_length=16, batch_size=2, steps=1, num_kv_heads=1, attention_window=4,
                      export=str(export)), log=QUIET)
    kwargs = json.loads((tmp_path / "w.pt.json").read_text())
    assert kwargs["num_kv_heads"] == 1 and kwargs["attention_window"] == 4
    BasicsTransformerLM(**kwargs).load_state_dict(torch.load(export))


def test_resume_checks_the_attention_shape(tmp_path):
    """A checkpoint of another num_kv_heads is refused; one written before the fields existed (no such keys in its
    train state) resumes the default model."""
    run = tmp_path / "run"
    train(TrainConfig(preset="tiny", context_length=16, batch_size=2, steps=1, checkpoint_dir=str(run)), log=QUIET)
    with pytest.raises(ValueError, match="another model \\(num_kv_heads None there, 2 here\\)"):
        train(TrainConfig(preset="tiny", context_length=16, batch_size=2, steps=2, checkpoint_dir=str(run),
                          resume=True, num_kv_heads=2), log=QUIET)
    state_file = run / "step-000001" / "train_state.json"
    state = json.loads(state_file.read_text())
    for k in ("num_kv_heads", "attention_window"):
        del state["model"][k]
    state_file.write_text(json.dumps(state))
    out = train(TrainConfig(preset="tiny", context_length=16, batch_size=2, steps=2, checkpoint_dir=str(run),
                            resume=True), log=QUIET)
    assert out["start_step"] == 1 and len(out["rows"]) == 1


def _refused(capsys, *argv: str) -> str:
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def test_cli_refuses_bad_attention_options(capsys):
    for argv, needle in ((["--num-kv-heads", "3"], "--num-kv-heads: num_kv_heads must be a positive divisor of "
                                                   "num_heads (4)"),
                         (["--num-kv-heads", "0"], "--num-kv-heads"),
                         (["--attention-window", "0"], "--attention-window: attention_window must be a positive"),
                         (["--eos-id", "512"], "--eos-id must be a token id in 0..511"),
                         (["--eos-id", "-1"], "--eos-id must be a token id in 0..511"),
                         (["--eos-id", "1", "--attention", "old_style_test"],
                          "--attention old_style_test takes no window=")):
        assert needle in _refused(capsys, *argv), argv


DIST = dict(preset="tiny", context_length=16, steps=2, lr=3e-3, min_lr=3e-4, seed=5, eos_id=511, num_kv_heads=2)


def _documents_worker(info, path: str):
    return {p: train(TrainConfig(**DIST, batch_size=2, data=path, parallel=p, loss=loss), info=info, log=QUIET)
            for p, loss in (("fsdp", "unfused"), ("bucketed", "fused"))}


@pytest.mark.timeout(120)
def test_doc_ids_flow_through_parallel_wrappers(tmp_path):
    """2 ranks x batch 2 with --eos-id under our FSDP and bucketed DDP (with the fused loss) log the losses of one
    process on the global batch of 4 (fp32, summation order only: rel 1e-5, as tests/test_train.py)."""
    from cs336_systems.parallel.process_group import spawn

    path = tmp_path / "docs.bin"
    packed_file(path, eos=511, seed=3)
    r0, _ = spawn(_documents_worker, 2, (str(path),), timeout_s=100)
    ref = train(TrainConfig(**DIST, batch_size=4, data=str(path)), log=QUIET)
    for p, out in r0.items():
        for a, b in zip(out["rows"], ref["rows"], strict=True):
            assert a["loss"] == pytest.approx(b["loss"], rel=1e-5), p
