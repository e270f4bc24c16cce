"""N `partially_shared_roberta` models of one shape as one stacked model: every weight gets a leading model axis.

Dufter & Schuetze's BERT-small (64 hidden, 1 head) is so small that one training step is a few hundred tiny kernel
launches: the GPU waits on Python, not on arithmetic. Stacking N runs turns each linear layer of all N models into
one batched matrix product (`baddbmm`) and each attention into one over N x B sequences, so N runs cost about one
run's launches. The math is the model's own (post-LayerNorm BERT layers, tied output embedding, lang-pos position
tables + segment embedding; lang-pos and shared-position models stack together) and
`tests/test_packed_training.py` checks the logits against `PartiallySharedRoberta.forward` for every slot (on the
GPU's kernels: `tests/gpu/test_stacked_equal.py`).

All weights of all models live in one flat (N, P) buffer, every named weight a view of it. `gradients` hands the
optimizer (`optim.AdamState`) each autograd leaf's gradient as backward computed it, with the leaf's columns of the
buffer.
On the GPU the attention is `attention_kernels.short_attention` (Triton); on the CPU, SDPA with a mask.
"""
import math
import types

import torch
import torch.nn.functional as F

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.packed.attention_kernels import short_attention


LANG_POS_WEIGHTS = ("position_embeddings.1.weight", "language_embedding.weight")


def check_stackable(model):
    """The stacked forward covers the Fake-English models: one token table, every layer shared."""
    if len(model.token_embeddings) != 1 or model.separate_layers:
        raise XmlmError("packed training supports shared embeddings and layers only (no --sep-emb / --sep-layers)")
    if model.cfg.compile or getattr(model.cfg, "amp_bf16", False):
        raise XmlmError("packed training sets its own precision and launch strategy: drop --compile / --amp-bf16")


def _layer_norm(x, weight, bias, eps=1e-5):
    """LayerNorm over the last axis with each model's own affine (weight, bias: (N, D)); x (N, ..., D)."""
    shape = (x.size(0),) + (1,) * (x.dim() - 2) + (x.size(-1),)
    return torch.addcmul(bias.view(shape), F.layer_norm(x, x.shape[-1:], eps=eps), weight.view(shape))


def _linear(x, weight, bias):
    """x (N, R, I), weight (N, O, I), bias (N, O) -> (N, R, O): one batched product for all models."""
    return torch.baddbmm(bias.unsqueeze(1), x, weight.transpose(1, 2))


def _product(x, weight, bias):
    """`_linear` with the bias added after the product: compiled, the add fuses into the next kernel (but not into
    torch's dropout kernel, see `fallback_random`), where `baddbmm` first copies the broadcast bias into its output
    (copies went from 3.3 to 0.9 ms of a 2-run BERT-base step; 2026-11-26, one H100, commit 9b7c430)."""
    return torch.bmm(x, weight.transpose(1, 2)) + bias.unsqueeze(1)


def encoder_layer(x, block, layout, code, heads, activation, dropout, attention_dropout, activation_dropout,
                  rows=None):
    """Post-LayerNorm BERT layer of every model; x (N, B, T, D), block (N, P) the layer's weights of each model as
    one row, `layout` their in-layer names -> (offset, size, shape) in a row, code the rows of the attention
    (`attention_code`, (N*B/G, G*T)): G sentences to a row. A plain function of tensors, so one torch.compile
    serves every layer.

    With `rows` (N, M), flat indices into each model's B*T, the layer returns only those positions, (N, M, D): the
    top layer, where only the targets reach the loss. Every position still serves as a key and value of the
    attention; the output projection, the FFN and both LayerNorms then run on the M rows (about 15 % of B*T) alone.

    The weights are sliced here, inside the compiled graph, so that autograd sees one leaf per layer, not 16: a
    2-run BERT-base step waited on the host, which spent 4.2 of its 59 ms (under the profiler) accumulating
    gradients one weight at a time (2026-11-26, one H100, before commit bdad154)."""
    w = {name: block[:, offset:offset + size].view(block.size(0), *shape)
         for name, (offset, size, shape) in layout.items()}
    n, b, t, d = x.shape
    h = x.reshape(n, b * t, d)
    # q, k and v's bias goes into the attention, which adds it as it loads them: an add after the product would be
    # a pass of its own over q, k and v, and `baddbmm` (`_linear`) first copies the broadcast bias into its output
    # (0.61 ms of an 11-run BERT-small step's 10.29 kernel ms; 2026-11-28, one H200, before commit 8bee3c8)
    qkv = torch.bmm(h, w["attention.qkv.weight"].transpose(1, 2))
    y = attention(qkv, w["attention.qkv.bias"], code, heads, attention_dropout)
    if rows is not None:
        index = rows.unsqueeze(-1).expand(-1, -1, d)
        h, y = h.gather(1, index), y.gather(1, index)
    y = _product(y, w["attention.out.weight"], w["attention.out.bias"])
    h = _layer_norm(h + F.dropout(y, dropout), w["attention_norm.weight"], w["attention_norm.bias"])
    f = F.dropout(activation(_product(h, w["ffn_in.weight"], w["ffn_in.bias"])), activation_dropout)
    f = _product(f, w["ffn_out.weight"], w["ffn_out.bias"])
    h = _layer_norm(h + F.dropout(f, dropout), w["ffn_norm.weight"], w["ffn_norm.bias"])
    return h if rows is not None else h.view(n, b, t, d)


# Dufter's sentences are mostly short (median batch length 29 tokens): G of them share one row of the attention,
# up to ATTENTION_TILE tokens, so that each (row, head) of `short_attention` (and, before it, of SDPA's
# memory-efficient kernels, whose tiles are 64 x 64) has fewer idle queries and keys. Sharing rows cut SDPA's
# attention kernels of a 3-run BERT-base step from 5.83 to 3.51 ms (2026-11-27, one H200, commit 738d0f1).
ATTENTION_TILE = 64


def sentences_per_row(rows, length):
    """How many sentences of `length` tokens share one row of the attention: as many as fit in ATTENTION_TILE, a
    power of two that divides `rows`."""
    share = 1
    while 2 * share * length <= ATTENTION_TILE and rows % (2 * share) == 0:
        share *= 2
    return share


def attention_code(keep):
    """keep (R, T), the real tokens -> the rows of the attention, (R/G, G*T) int8 for G = `sentences_per_row`: per
    token 2 * (its sentence within the row) + (1 if real). A query sees the real tokens of its own sentence only,
    so G short sentences attend in one row exactly as each would alone."""
    rows, length = keep.shape
    share = sentences_per_row(rows, length)
    sentence = torch.arange(share * length, device=keep.device, dtype=torch.int8) // length
    return (2 * sentence + keep.view(rows // share, share * length)).to(torch.int8)


WHOLE_BATCH = 2 ** 31 - 1  # a micro-batch size that holds any batch


def collated_padding(keep, micro_batches):
    """keep (N, B, T), each model's real tokens (sentences start at position 0) -> (N, B, T), the positions that
    fairseq-train's collater gives each sentence: up to the longest sentence of its micro-batch, the consecutive
    `micro_batches[model]` rows it is in (WHOLE_BATCH: the model's whole batch). Not up to the group's length, which
    pads to the longest of its runs' batches (seeds stacked together draw others)."""
    n, b, t = keep.shape
    lengths = keep.sum(dim=2)  # (N, B)
    micro = torch.arange(b, device=keep.device).view(1, -1) // micro_batches.view(-1, 1)  # (N, B): each row's
    longest = torch.zeros_like(lengths).scatter_reduce(1, micro, lengths, "amax")  # (N, B): each micro-batch's
    return torch.arange(t, device=keep.device) < longest.gather(1, micro).unsqueeze(-1)


def attention_mask(code):
    """The SDPA mask (R/G, 1, G*T, G*T) of `attention_code`'s rows: block diagonal, real keys only."""
    sentence, real = code // 2, code % 2 == 1
    return ((sentence.unsqueeze(2) == sentence.unsqueeze(1)) & real.unsqueeze(1)).unsqueeze(1)


def attention(qkv, bias, code, heads, dropout):
    """qkv (N, L, 3D) before its bias (N, 3D) -> (N, L, D), attention over `attention_code`'s rows. On the GPU
    `short_attention`'s kernels (1.095x a 3-run BERT-base step's updates against SDPA's memory-efficient kernels;
    2026-11-28, one H200, commit 39cf41d); on the CPU, `sdpa_attention`."""
    return (short_attention if qkv.is_cuda else sdpa_attention)(qkv, bias, code, heads, dropout)


def sdpa_attention(qkv, bias, code, heads, dropout):
    """`attention` by SDPA with `attention_mask`'s mask, on q, k and v views of qkv."""
    n, length, width = qkv.shape
    dim = width // 3
    qkv = qkv + bias.unsqueeze(1)
    q, k, v = qkv.view(-1, code.size(-1), 3, heads, dim // heads).permute(2, 0, 3, 1, 4)
    y = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask(code), dropout_p=dropout)
    return y.transpose(1, 2).reshape(n, length, dim)


_LAYER_FUNCTIONS = {}


def layer_function(shape):
    """`encoder_layer` as a function of its own for stacked models of one `shape`, to compile. Dynamo keeps its
    compiled versions, and learns which sizes change from one call to the next, per function (file, line and name):
    through one function, a second shape of model in the process made every size of the layer dynamic, and its
    kernels slow (a BERT-small group in a process that had compiled a BERT-base one took 19.07 ms a step; with a
    function of its own, 11.00 ms; 2026-11-27, one H200, before and after commit de12ba3, on two machines). Only the
    batch's sizes should change, and do for each shape's own function."""
    if shape not in _LAYER_FUNCTIONS:
        name = "encoder_layer_" + "_".join(map(str, shape))
        code = encoder_layer.__code__.replace(co_name=name, co_qualname=name)
        _LAYER_FUNCTIONS[shape] = types.FunctionType(code, encoder_layer.__globals__, name,
                                                       encoder_layer.__defaults__)
    return _LAYER_FUNCTIONS[shape]


def _lookup(tables, ids, models):
    """Rows `ids` (N, ...) of each model's own table (tables (N, rows, D)): one F.embedding over the tables laid end
    to end. Its backward sums the rows of repeated ids in parallel, where advanced indexing's (`tables[models, ids]`)
    serialises them: 5.4 of 57 ms of GPU time in a 30-run BERT-small step (2026-11-26, one H100, before commit
    8254267)."""
    return F.embedding(ids + models * tables.size(1), tables.reshape(-1, tables.size(-1)))


def _aligned(offset, to=64):
    """Every weight starts, and every model's row of the flat buffers is, a multiple of 64 values long: cuBLAS's fast
    batched kernels need aligned matrices (unaligned, 2 stacked BERT-base runs spent 4.5x one run's time in matrix
    products; 2026-11-26, one H100, before commit 8254267)."""
    return -(-offset // to) * to


class StackedEncoder:
    """`weights[name]` is an (N, *shape) view of the flat compute buffer for each parameter of the N models outside
    the layers, and `layer_blocks[i]` the (N, P_i) view of layer i's, laid out as `layer_layouts[i]` says.

    The fp32 master weights live in `flat`; with dtype bf16 the forward pass reads a bf16 copy (`compute`, which the
    optimizer writes as it updates `flat`) so every activation and gradient is bf16 too: the scheme of fairseq's
    --fp16 (low-precision model, fp32 master weights and optimiser), without loss scaling since bf16 has fp32's
    range. With dtype fp32 the forward pass reads the master weights themselves.
    """

    def __init__(self, models, device, dtype=torch.float32, compile=False, attend_padding=None, micro_batches=None):
        """`attend_padding`: per model, whether its sentences attend to their batch's padding (fake_english
        --attend-padding: no attention mask, as `has_padding=False` in the model's forward); default none does.
        `micro_batches`: per model, the sentences of the micro-batches that its batches accumulate (fairseq-train's
        --batch-size under --update-freq; the batch's rows in consecutive runs of that many), each padded to its own
        longest sentence; None (the default, or for a model): the whole batch is padded as one."""
        for model in models:
            check_stackable(model)
        # lang-pos models have two weights more (LANG_POS_WEIGHTS); a model without them gets zeros in their place,
        # which its forward pass never reads and which therefore stay zero (no gradient, no weight decay)
        first = max(models, key=lambda model: len(list(model.parameters())))
        shapes = {name: p.shape for name, p in first.named_parameters()}
        self.names = []  # each model's own weights
        for model in models:
            own = {name: p.shape for name, p in model.named_parameters()}
            if any(shapes.get(name) != shape for name, shape in own.items()) or not set(shapes) - set(own) <= set(
                    LANG_POS_WEIGHTS):
                raise XmlmError("runs packed together must have the same architecture")
            self.names.append(list(own))
        self.count = len(models)
        self.num_layers = len(first.layers)
        self.heads = first.cfg.encoder_attention_heads
        self.activation = F.gelu if first.cfg.activation_fn == "gelu" else F.relu
        self.padding_idx = first.padding_idx
        self.lang_pos = torch.tensor([model.language_embedding is not None for model in models], device=device)
        self.any_lang_pos = bool(self.lang_pos.any())
        self.attend_padding = torch.tensor(attend_padding or [False] * len(models), device=device)
        self.any_attend_padding = bool(self.attend_padding.any())
        self.micro_batches = torch.tensor([m or WHOLE_BATCH for m in micro_batches or [None] * len(models)],
                                          device=device)
        # compiled, a layer's bias adds, residual adds and LayerNorms fuse into a few kernels instead of a dozen
        # memory-bound passes, and a small model launches fewer kernels
        model_shape = (self.count, first.cfg.encoder_embed_dim, first.cfg.encoder_ffn_embed_dim, self.heads)
        # fallback_random: the dropouts are torch's own kernels and draws, not inductor's. In a 3-run BERT-base step
        # inductor's LayerNorm kernels that drew dropout's random numbers took 127 us a launch, 46 us without them,
        # and torch's dropout kernel takes 34 us: 1.013x the steps, warm-up 72 s instead of 99 (2026-11-28, one
        # H200, before and after commit 8b5d05b on the same machine). Compiled and eager layers also draw the same
        # dropout from one seed.
        self.encoder_layer = torch.compile(layer_function(model_shape), options={"fallback_random": True}) \
            if compile else encoder_layer
        self.layout, offset = [], 0  # (name, offset, size, shape)
        for name, shape in shapes.items():
            self.layout.append((name, offset, math.prod(shape), shape))
            offset = _aligned(offset + math.prod(shape))
        self.flat = torch.zeros(self.count, offset, device=device)  # the gaps between weights stay zero
        parameters = [dict(model.named_parameters()) for model in models]
        for name, _, _, _ in self.layout:
            master = self._view(self.flat, name)
            for slot, own in enumerate(parameters):
                if name in own:
                    master[slot].copy_(own[name].detach())
        self.compute = torch.empty_like(self.flat, dtype=dtype) if dtype != torch.float32 else self.flat
        self.refresh()
        # Leaves sharing the compute buffer's storage, with their columns in it (`leaf_columns`): one leaf per weight
        # outside the layers; one per layer, with its weights' places in it, for `encoder_layer`.
        self.leaves, self.leaf_columns = [], []
        self.weights = {name: self._leaf(offset, offset + size, shape)
                        for name, offset, size, shape in self.layout if not name.startswith("layers.")}
        self.layer_blocks, self.layer_layouts = [], []
        for i in range(self.num_layers):
            prefix = f"layers.{i}.0."
            entries = [entry for entry in self.layout if entry[0].startswith(prefix)]
            start, end = entries[0][1], entries[-1][1] + entries[-1][2]
            self.layer_blocks.append(self._leaf(start, end))
            self.layer_layouts.append({name[len(prefix):]: (offset - start, size, shape)
                                       for name, offset, size, shape in entries})

    def _columns(self, buffer, start, end, shape=(-1,)):
        return buffer[:, start:end].view(self.count, *shape)

    def _leaf(self, start, end, shape=(-1,)):
        """Columns start:end of the compute buffer as an (N, *shape) leaf."""
        leaf = self._columns(self.compute, start, end, shape).detach().requires_grad_()
        self.leaves.append(leaf)
        self.leaf_columns.append((start, end))
        return leaf

    def gradients(self, loss):
        """Each leaf's gradient of `loss`, as backward computed it (zeros for a leaf the loss does not reach). Not
        through .grad: accumulating into a gradient buffer was one more pass over every gradient (0.9 ms of a 41 ms
        3-run BERT-base step; 1.010x its updates/s without it; 2026-11-27, one H200, commit de12ba3)."""
        return torch.autograd.grad(loss, self.leaves, materialize_grads=True)

    def _view(self, buffer, name):
        _, offset, size, shape = next(entry for entry in self.layout if entry[0] == name)
        return self._columns(buffer, offset, offset + size, shape)

    def refresh(self):
        """Copy the master weights into the low-precision compute buffer (nothing to do in fp32), after they were
        set other than by the optimizer."""
        if self.compute is not self.flat:
            self.compute.copy_(self.flat)

    def state_dict(self, slot):
        """The fp32 parameters of model `slot` under the model's own names."""
        return {name: self._view(self.flat, name)[slot].clone() for name in self.names[slot]}

    def embed(self, tokens, langs):
        """tokens (N, B, T), langs (N, B) -> (N, B, T, D) after the embedding LayerNorm."""
        w = self.weights
        models = torch.arange(self.count, device=tokens.device).view(-1, 1, 1)
        x = _lookup(w["token_embeddings.0.weight"], tokens, models)
        # nn.Embedding(padding_idx) gives the pad row no gradient from lookups (the tied output layer still does)
        x = torch.where(tokens.eq(self.padding_idx).unsqueeze(-1), x.detach(), x)
        length = tokens.size(2)
        positions = w["position_embeddings.0.weight"][:, None, :length]
        if self.any_lang_pos:  # the lang-pos models' own positions for Fake-English and their segment embedding
            lang_pos = self.lang_pos.view(-1, 1)
            fake = (langs.eq(1) & lang_pos)[:, :, None, None]
            positions = torch.where(fake, w["position_embeddings.1.weight"][:, None, :length], positions)
            segment = _lookup(w["language_embedding.weight"], langs, models.view(-1, 1))
            x = x + (segment * lang_pos.unsqueeze(-1)).unsqueeze(2)
        return _layer_norm(x + positions, w["embedding_norm.weight"], w["embedding_norm.bias"])

    def masked_logits(self, tokens, langs, positions, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0):
        """Logits (N, M, V) at `positions` (N, M) (flat indices into each model's B*T), for all N models at once.

        Dropout as in training when the rates are > 0 (0 = evaluation). Short sentences share rows of the attention
        (`attention_code`).
        """
        n, b, t = tokens.shape
        keep = tokens.ne(self.padding_idx)
        if self.any_attend_padding:
            keep = keep | (self.attend_padding.view(-1, 1, 1) & collated_padding(keep, self.micro_batches))
        code = attention_code(keep.view(n * b, t))
        x = F.dropout(self.embed(tokens, langs), dropout)
        # the batch's sizes change from one batch to the next: compiled for any size from the first batch on,
        # not first for the first batch's sizes and then again for any (a cold warm-up of 3 BERT-base runs 67.0 ->
        # 43.2 s; 2026-11-28, one H200, commit ed97d80)
        for tensor, dims in ((code, (0, 1)), (positions, (1,))):
            for dim in dims:
                torch._dynamo.maybe_mark_dynamic(tensor, dim)
        for i, (block, layout) in enumerate(zip(self.layer_blocks, self.layer_layouts)):
            top = i == self.num_layers - 1
            torch._dynamo.maybe_mark_dynamic(x, 1)
            torch._dynamo.maybe_mark_dynamic(x, 2)
            x = self.encoder_layer(x, block, layout, code, self.heads, self.activation, dropout, attention_dropout,
                                   activation_dropout, rows=positions if top else None)
        features = x  # (N, M, D): the top layer computed the target positions only
        w = self.weights
        h = F.gelu(_linear(features, w["lm_dense.weight"], w["lm_dense.bias"]))  # the LM head is GELU always
        h = _layer_norm(h, w["lm_norm.weight"], w["lm_norm.bias"])
        return _linear(h, w["token_embeddings.0.weight"], w["lm_bias.0"])
