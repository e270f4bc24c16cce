"""`partially_shared_roberta`: one RoBERTa/BERT-style encoder for every experiment of both papers.

Which parts are shared between languages is a setting:
- position embeddings (+ a language/segment embedding) per language: Dufter & Schuetze's `lang-pos`
  (a task flag; the task tells the model through `task.lang_pos`);
- token embeddings + position embeddings per language (`--sep-emb`): Conneau et al.'s "Sep Emb"; the output
  projection is tied to the token embeddings, so the softmax is language-specific too, and it is restricted to the
  language's own vocabulary (`task.language_vocab_masks()`);
- bottom Transformer layers per language (`--sep-layers 1-3`): Conneau et al.'s "Sep L1-3"; inputs are routed by
  language id, the layers above stay shared.

Attention goes through `torch.nn.functional.scaled_dot_product_attention` (flash / memory-efficient kernels on GPU).
Layers are post-LayerNorm as in BERT. `encode_layers` returns the states of every layer, layer 0 being the
embedding output after LayerNorm, which is what the multilinguality metrics read.
"""
import os
from contextlib import nullcontext
from dataclasses import dataclass, field
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F
from fairseq.dataclass import ChoiceEnum, FairseqDataclass
from fairseq.models import BaseFairseqModel, register_model, register_model_architecture
from torch.nn.attention import SDPBackend, sdpa_kernel

from fairseq_xmlm.errors import XmlmError
from fairseq_xmlm.models.bias_gelu import bias_gelu
from fairseq_xmlm.models.dropout_norm import dropout_add_layer_norm
from fairseq_xmlm.models.residual_products import linear_products
from fairseq_xmlm.precision import bf16_autocast


@dataclass
class PartiallySharedRobertaConfig(FairseqDataclass):
    encoder_layers: int = field(default=12, metadata={"help": "number of Transformer layers"})
    encoder_embed_dim: int = field(default=768, metadata={"help": "hidden size"})
    encoder_ffn_embed_dim: int = field(default=3072, metadata={"help": "feed-forward inner size"})
    encoder_attention_heads: int = field(default=12, metadata={"help": "attention heads"})
    activation_fn: ChoiceEnum(["gelu", "relu"]) = field(default="gelu", metadata={"help": "FFN activation"})
    dropout: float = field(default=0.1, metadata={"help": "dropout on embeddings, attention output and FFN output"})
    attention_dropout: float = field(default=0.1, metadata={"help": "dropout on attention probabilities"})
    activation_dropout: float = field(
        default=0.0, metadata={"help": "dropout after the FFN activation (0 as in BERT, XLM and fairseq's RoBERTa)"}
    )
    max_positions: int = field(default=0, metadata={"help": "learned positions per language (0: the task's)"})
    sep_emb: bool = field(
        default=False, metadata={"help": "language-specific token + position embeddings (and so softmax)"}
    )
    sep_layers: str = field(
        default="", metadata={"help": "1-based range of bottom layers copied per language, e.g. 1-3"}
    )
    compile: bool = field(default=False, metadata={"help": "torch.compile each Transformer layer (--compile-scope)"})
    compile_scope: ChoiceEnum(["layer", "encoder"]) = field(
        default="layer",
        metadata={"help": "what --compile compiles as one graph: each Transformer layer, or all of them (encoder: "
                          "under reduce-overhead one CUDA graph forward and one backward in place of one a layer; "
                          "longer to compile, and no faster at the Conneau config: docs/performance.md)"},
    )
    compile_mode: ChoiceEnum(["default", "reduce-overhead", "max-autotune"]) = field(
        default="default",
        metadata={"help": "torch.compile mode of --compile; reduce-overhead replays each layer as a CUDA graph (no "
                          "launch cost per kernel), for batches of one shape such as full 256-token streams: each "
                          "new shape records another graph"},
    )
    amp_bf16: bool = field(
        default=False, metadata={"help": "forward pass under bf16 autocast, fp32 weights (fairseq's --bf16 needs a TPU)"}
    )
    bf16_params: bool = field(
        default=False,
        metadata={"help": "parameters and activations in bf16, as --fp16 keeps them in fp16 but with no loss scaling; "
                          "needs --optimizer xmlm_adamw (fp32 master weights) and neither --fp16 nor --amp-bf16"},
    )
    fused_dropout_norm: bool = field(
        default=False,
        metadata={"help": "each layer's LayerNorm(residual + dropout(x + bias)) in one Triton kernel of ours forward "
                          "and one backward, on a GPU (models/dropout_norm.py): eight dropout draws a Philox call "
                          "where inductor's kernel makes one, and no mask kept for backward"},
    )
    fused_bias_gelu: bool = field(
        default=False,
        metadata={"help": "the feed-forward activation GELU(x + bias) in one Triton kernel of ours forward and one "
                          "backward, on a GPU (models/bias_gelu.py): backward reads its inputs once, where inductor's "
                          "kernels read them twice and compute GELU again; for --activation-fn gelu with no "
                          "--activation-dropout"},
    )
    residual_grad_in_products: bool = field(
        default=False,
        metadata={"help": "the gradient of a layer's input, which feeds products and the residual sum, added up in "
                          "the products' input-gradient GEMMs (cuBLAS's epilogue, in place where compiled), not in a "
                          "kernel of its own: two adds a layer fewer (models/residual_products.py); not under "
                          "--amp-bf16"},
    )
    one_qkv_product: bool = field(
        default=False,
        metadata={"help": "with --residual-grad-in-products: Q, K and V from one product of the fused weight, its "
                          "output in three column blocks (one GEMM forward where there were three); their gradients "
                          "still arrive apart, in the layout their products need"},
    )
    cublaslt_no_workspace: bool = field(
        default=False,
        metadata={"help": "cuBLASLt without workspace (CUBLASLT_WORKSPACE_SIZE=0 unless the environment sets it, "
                          "set when the model is built, before torch's first cuBLASLt product): the products with a "
                          "bias in cuBLASLt's epilogue (Q, K and V) then take statically scheduled kernels, which "
                          "need no memset of a tile counter before each call, 3-4 us with its gaps in a CUDA graph "
                          "(docs/performance.md)"},
    )
    cudnn_attention: bool = field(
        default=False,
        metadata={"help": "attention through cuDNN's fused kernel first (flash / memory-efficient if it cannot): "
                          "for batches of one shape, such as full 256-token streams; cuDNN plans each new shape "
                          "on the host, milliseconds per sequence length"},
    )


def parse_layer_range(text, num_layers):
    """"1-3" -> range(0, 3) (0-based layer indices); "" -> empty range. Clear error outside the model depth."""
    if not text:
        return range(0)
    try:
        first, last = (int(x) for x in text.split("-")) if "-" in text else (int(text), int(text))
    except ValueError:
        raise XmlmError(f"--sep-layers must look like 1-3, got {text!r}")
    if not 1 <= first <= last <= num_layers:
        raise XmlmError(f"--sep-layers {text} is outside the model's layers 1-{num_layers}")
    return range(first - 1, last)


# torch reads it at its first cuBLASLt product (KiB of workspace; 0: none)
CUBLASLT_WORKSPACE = "CUBLASLT_WORKSPACE_SIZE"


def avoid_cudnn_attention():
    """Let SDPA choose flash / memory-efficient / math kernels, not cuDNN's.

    Measured on an H100 (torch 2.11): cuDNN's attention spends 5-10 ms of host time per call building an execution
    plan whenever the sequence length changes, i.e. at almost every batch of sentences; 24 such calls per update
    made BERT training wait on the CPU. The other kernels cost microseconds to launch. `--cudnn-attention` puts
    cuDNN first again around each attention call, for batches of one shape (one plan, built once).
    """
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


# Backend order of `--cudnn-attention`; the others stay as fallbacks (masks, CPU).
CUDNN_FIRST = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
               SDPBackend.MATH]


class SelfAttention(nn.Module):
    def __init__(self, dim, heads, dropout, cudnn=False):
        super().__init__()
        if dim % heads:
            raise XmlmError(f"hidden size {dim} is not divisible by {heads} attention heads")
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.dropout = dropout
        self.cudnn = cudnn

    def forward(self, x, keep):
        """x (B, T, D); keep (B, 1, 1, T) bool, True for real (non-pad) keys."""
        return self.out(self.attend(x, keep)[0])

    def attend(self, x, keep, residual_grad_in_products=False, one_product=False):
        """(The heads' outputs side by side (B, T, D), before the output product; x for the residual sum, through the
        products with `residual_grad_in_products`); `one_product`: Q, K and V as one product's column blocks."""
        b, t, d = x.shape
        # Three products with slices of the fused weight, not one product split afterwards: the attention kernel
        # then returns each gradient in the layout its product needs, where the split's backward stacks and
        # transposes the whole (B, T, 3D) gradient (two extra passes, ~0.4 ms per layer on an H100 at the Conneau
        # config). The parameters (and checkpoints) stay one `qkv` layer. With the residual's gradient in the
        # products one product can serve all three (`one_product`): our autograd function receives each block's
        # gradient apart, so nothing is stacked.
        if one_product and residual_grad_in_products:
            products, residual = linear_products(x, [self.qkv.weight], [self.qkv.bias], True, parts=3)
        else:
            products, residual = linear_products(x, self.qkv.weight.chunk(3), self.qkv.bias.chunk(3),
                                                 residual_grad_in_products)
        q, k, v = (p.view(b, t, self.heads, d // self.heads).transpose(1, 2) for p in products)
        with sdpa_kernel(CUDNN_FIRST, set_priority=True) if self.cudnn else nullcontext():
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep,
                                               dropout_p=self.dropout if self.training else 0.0)
        return y.transpose(1, 2).reshape(b, t, d), residual


class TransformerLayer(nn.Module):
    """Post-LayerNorm BERT layer."""

    def __init__(self, cfg):
        super().__init__()
        dim = cfg.encoder_embed_dim
        # configurations saved before an option existed have no key for it
        self.attention = SelfAttention(dim, cfg.encoder_attention_heads, cfg.attention_dropout,
                                       getattr(cfg, "cudnn_attention", False))
        self.attention_norm = nn.LayerNorm(dim)
        self.ffn_in = nn.Linear(dim, cfg.encoder_ffn_embed_dim)
        self.ffn_out = nn.Linear(cfg.encoder_ffn_embed_dim, dim)
        self.ffn_norm = nn.LayerNorm(dim)
        self.activation = F.gelu if cfg.activation_fn == "gelu" else F.relu
        self.dropout = nn.Dropout(cfg.dropout)
        self.activation_dropout = nn.Dropout(getattr(cfg, "activation_dropout", 0.0))
        self.fused_dropout_norm = getattr(cfg, "fused_dropout_norm", False)
        self.fused_bias_gelu = (getattr(cfg, "fused_bias_gelu", False) and cfg.activation_fn == "gelu"
                                and not getattr(cfg, "activation_dropout", 0.0))
        self.residual_grad_in_products = getattr(cfg, "residual_grad_in_products", False)
        self.one_qkv_product = getattr(cfg, "one_qkv_product", False)

    def forward(self, x, keep):
        heads, residual = self.attention.attend(x, keep, self.residual_grad_in_products, self.one_qkv_product)
        x = self.add_and_norm(heads, self.attention.out, residual, self.attention_norm)
        fused_gelu = self.fused_bias_gelu and x.is_cuda  # the product's bias added in our kernel
        (product,), residual = linear_products(x, [self.ffn_in.weight], [None if fused_gelu else self.ffn_in.bias],
                                               self.residual_grad_in_products)
        if fused_gelu:
            hidden = bias_gelu(product, self.ffn_in.bias)
        else:
            hidden = self.activation_dropout(self.activation(product))
        return self.add_and_norm(hidden, self.ffn_out, residual, self.ffn_norm)

    def add_and_norm(self, branch, product, residual, norm):
        """norm(residual + dropout(product(branch))): in our kernels with `--fused-dropout-norm` on a GPU (the
        product's bias added there), where the branch and the residual are of one type (not under autocast)."""
        if self.fused_dropout_norm and residual.is_cuda and branch.dtype == residual.dtype:
            return dropout_add_layer_norm(F.linear(branch, product.weight), product.bias, residual, norm,
                                          self.dropout.p if self.training else 0.0)
        return norm(residual + self.dropout(product(branch)))


def route_by_language(modules, lang_ids, num_langs, *inputs, batch_lang=None):
    """Apply modules[l] to the rows of language l; rows of other languages never touch modules[l]. An input may be
    None (no attention mask). `batch_lang`: the one language of every row, known to the collater; the rows then
    need not be found on the device (a host sync per call, 2-14 per update of a Sep row)."""
    if num_langs == 1:
        return modules[0](*inputs)
    if batch_lang is not None:
        return modules[batch_lang](*inputs)
    out = None
    for lang in range(num_langs):
        rows = (lang_ids == lang).nonzero().squeeze(1)
        if rows.numel() == 0:
            continue
        y = modules[lang](*(None if t is None else t[rows] for t in inputs))
        if out is None:
            out = y.new_empty((lang_ids.size(0),) + y.shape[1:])
        out[rows] = y
    return out


def run_layers(layers, x, keep, lang_ids, batch_lang):
    """Each layer's output, the input `x` going up through `layers` (a list of per-language copies each)."""
    states = []
    for copies in layers:
        x = route_by_language(copies, lang_ids, len(copies), x, keep, batch_lang=batch_lang)
        states.append(x)
    return states


def lookup_by_language(tables, lang_ids, ids):
    """Row b of the result is tables[lang_ids[b]](ids[b]).

    Unlike `route_by_language` this never asks the GPU which rows belong to which language (no host sync, which
    stalls a small model's launch queue every step): every table looks up every row, cheap for an embedding, and
    `torch.where` keeps the row's own language. Rows of other languages give a table exactly zero gradient.
    """
    out = tables[0](ids)
    for lang in range(1, len(tables)):
        out = torch.where((lang_ids == lang).view(-1, *[1] * (out.dim() - 1)), tables[lang](ids), out)
    return out


@register_model("partially_shared_roberta", dataclass=PartiallySharedRobertaConfig)
class PartiallySharedRoberta(BaseFairseqModel):
    def __init__(self, cfg, dictionary_size, padding_idx, num_langs, lang_pos, vocab_masks):
        super().__init__()
        self.cfg = cfg
        self.padding_idx = padding_idx
        self.num_langs = num_langs
        self.lang_pos = lang_pos
        self.max_positions_per_lang = cfg.max_positions
        dim = cfg.encoder_embed_dim
        n_token_tables = num_langs if cfg.sep_emb else 1
        n_position_tables = num_langs if (cfg.sep_emb or lang_pos) else 1
        self.token_embeddings = nn.ModuleList(
            nn.Embedding(dictionary_size, dim, padding_idx=padding_idx) for _ in range(n_token_tables)
        )
        self.position_embeddings = nn.ModuleList(
            nn.Embedding(cfg.max_positions, dim) for _ in range(n_position_tables)
        )
        # Dufter & Schuetze's lang-pos pairs language-specific positions with a segment embedding (0/1).
        self.language_embedding = nn.Embedding(num_langs, dim) if lang_pos else None
        self.embedding_norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(cfg.dropout)

        self.separate_layers = parse_layer_range(cfg.sep_layers, cfg.encoder_layers)
        self.layers = nn.ModuleList(
            nn.ModuleList(TransformerLayer(cfg) for _ in range(num_langs if i in self.separate_layers else 1))
            for i in range(cfg.encoder_layers)
        )
        self.lm_dense = nn.Linear(dim, dim)
        self.lm_norm = nn.LayerNorm(dim)
        self.lm_bias = nn.ParameterList(nn.Parameter(torch.zeros(dictionary_size)) for _ in range(n_token_tables))
        # With separate embeddings each language predicts only its own vocabulary.
        self.register_buffer("vocab_masks", vocab_masks if cfg.sep_emb else None)
        self.apply(self._init_weights)
        avoid_cudnn_attention()
        self.run_layers = run_layers
        if cfg.compile and getattr(cfg, "compile_scope", "layer") == "encoder":
            self.run_layers = torch.compile(run_layers, mode=getattr(cfg, "compile_mode", "default"))
        elif cfg.compile:
            for layer_copies in self.layers:
                for layer in layer_copies:
                    layer.compile(mode=getattr(cfg, "compile_mode", "default"))

    @staticmethod
    def _init_weights(module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)
            if isinstance(module, nn.Embedding) and module.padding_idx is not None:
                nn.init.zeros_(module.weight[module.padding_idx])

    @classmethod
    def build_model(cls, cfg, task):
        """task: a `tasks.contract.ModelTask` (languages, dictionary, lang_pos, max positions, vocabulary masks)."""
        if not cfg.max_positions:
            cfg.max_positions = task.max_positions()
        num_langs = len(task.langs)
        if cfg.sep_emb and num_langs < 2:
            raise XmlmError("--sep-emb needs a task with at least two languages")
        if cfg.sep_layers and num_langs < 2:
            raise XmlmError("--sep-layers needs a task with at least two languages")
        if getattr(cfg, "bf16_params", False) and getattr(cfg, "amp_bf16", False):
            raise XmlmError("--bf16-params and --amp-bf16 are two ways to train in bf16: choose one")
        if getattr(cfg, "cublaslt_no_workspace", False):
            os.environ.setdefault(CUBLASLT_WORKSPACE, "0")
        vocab_masks = task.language_vocab_masks() if cfg.sep_emb else None
        model = cls(cfg, len(task.dictionary), task.dictionary.pad(), num_langs, task.lang_pos, vocab_masks)
        return model.to(torch.bfloat16) if getattr(cfg, "bf16_params", False) else model

    def max_positions(self):
        return self.max_positions_per_lang

    def language_parameters(self):
        """{language index: names of the parameters that only that language uses}; every other one is shared.

        (lang-pos's segment embedding is one table with a row per language; it is listed as shared.)
        """
        owned = {lang: [] for lang in range(self.num_langs)}
        groups = []
        if len(self.token_embeddings) > 1:
            groups += [("token_embeddings", self.token_embeddings), ("lm_bias", self.lm_bias)]
        if len(self.position_embeddings) > 1:
            groups.append(("position_embeddings", self.position_embeddings))
        groups += [(f"layers.{i}", self.layers[i]) for i in self.separate_layers]
        for prefix, copies in groups:
            for lang, module in enumerate(copies):
                if isinstance(module, nn.Parameter):
                    owned[lang].append(f"{prefix}.{lang}")
                else:
                    owned[lang] += [f"{prefix}.{lang}.{name}" for name, _ in module.named_parameters()]
        return owned

    def _check_lang_ids(self, src_tokens, lang_ids):
        if lang_ids is None:
            if self.num_langs > 1 and (self.lang_pos or len(self.token_embeddings) > 1 or self.separate_layers):
                raise XmlmError("this model has language-specific parts: pass lang_ids")
            return src_tokens.new_zeros(src_tokens.size(0))
        return lang_ids

    def position_states(self, lang_ids, length):
        """(1 or B, length, D): the first `length` rows of each row's language's position table. A slice, not an
        embedding lookup: its gradient is one sum over the batch, where a lookup's backward sorts B x T indices
        (a dozen kernel launches per step)."""
        if len(self.position_embeddings) == 1:
            return self.position_embeddings[0].weight[:length].unsqueeze(0)
        return torch.stack([table.weight[:length] for table in self.position_embeddings]).index_select(0, lang_ids)

    def embed(self, src_tokens, lang_ids):
        if src_tokens.size(1) > self.max_positions_per_lang:
            raise XmlmError(f"input of {src_tokens.size(1)} tokens exceeds max_positions {self.max_positions_per_lang}")
        x = lookup_by_language(self.token_embeddings, lang_ids, src_tokens)
        x = x + self.position_states(lang_ids, src_tokens.size(1))
        if self.language_embedding is not None:
            x = x + self.language_embedding(lang_ids).unsqueeze(1)
        return self.embedding_norm(x)

    def encode_layers(self, src_tokens, lang_ids=None, last_layer=None, has_padding=None, batch_lang=None):
        """List of (B, T, D) states: index 0 = embeddings after LayerNorm, index i = output of layer i.

        `last_layer` stops early (evaluation at layers 0 and 8 need not run the top layers). `has_padding` (known to
        the collater) False drops the attention mask, so SDPA may use the flash kernel (full 256-token streams);
        None asks the tokens, which on a GPU waits for it. `batch_lang` (known to the collater): the language of
        every row, or None.
        """
        lang_ids = self._check_lang_ids(src_tokens, lang_ids)
        keep = None if has_padding is False else src_tokens.ne(self.padding_idx)[:, None, None, :]
        if keep is not None and has_padding is None and src_tokens.is_cuda and bool(keep.all()):
            keep = None
        x = self.embed(src_tokens, lang_ids)
        return [x] + self.run_layers(self.layers[:last_layer], self.dropout(x), keep, lang_ids, batch_lang)

    def output_logits(self, features, lang_of_row, batch_lang=None):
        """features (N, D) -> logits (N, V), each row through its language's tied output embedding."""
        h = self.lm_norm(F.gelu(self.lm_dense(features)))
        if len(self.token_embeddings) == 1:
            return F.linear(h, self.token_embeddings[0].weight, self.lm_bias[0])
        heads = [partial(F.linear, weight=emb.weight, bias=bias) for emb, bias in zip(self.token_embeddings, self.lm_bias)]
        logits = route_by_language(heads, lang_of_row, self.num_langs, h, batch_lang=batch_lang)
        if batch_lang is not None:
            return logits.masked_fill(~self.vocab_masks[batch_lang], float("-inf"))
        return logits.masked_fill(~self.vocab_masks[lang_of_row], float("-inf"))

    def forward(self, src_tokens, lang_ids=None, masked_tokens=None, features_only=False, return_all_hiddens=False,
                masked_positions=None, has_padding=None, batch_lang=None, **unused):
        """Logits of the positions chosen by `masked_tokens` (a (B, T) bool mask) or `masked_positions` (flat
        indices into B * T, ascending: the same rows, gathered without a host sync), else of every position."""
        lang_ids = self._check_lang_ids(src_tokens, lang_ids)
        with bf16_autocast(src_tokens.device, getattr(self.cfg, "amp_bf16", False)):
            states = self.encode_layers(src_tokens, lang_ids, has_padding=has_padding, batch_lang=batch_lang)
            extra = {"inner_states": states if return_all_hiddens else [states[-1]]}
            features = states[-1]
            if features_only:
                return features, extra
            lang_of_token = lang_ids.unsqueeze(1).expand_as(src_tokens)
            if masked_positions is not None:
                features = features.reshape(-1, features.size(-1)).index_select(0, masked_positions)
                lang_of_token = lang_of_token.reshape(-1).index_select(0, masked_positions)
            elif masked_tokens is not None:
                features, lang_of_token = features[masked_tokens], lang_of_token[masked_tokens]
            logits = self.output_logits(features.reshape(-1, features.size(-1)), lang_of_token.reshape(-1),
                                        batch_lang)
        return logits.view(*features.shape[:-1], -1), extra


def _architecture(name, layers, dim, heads, ffn, max_positions=0):
    @register_model_architecture("partially_shared_roberta", name)
    def arch(cfg):
        cfg.encoder_layers = getattr(cfg, "encoder_layers", layers)
        cfg.encoder_embed_dim = getattr(cfg, "encoder_embed_dim", dim)
        cfg.encoder_attention_heads = getattr(cfg, "encoder_attention_heads", heads)
        cfg.encoder_ffn_embed_dim = getattr(cfg, "encoder_ffn_embed_dim", ffn)
        cfg.max_positions = getattr(cfg, "max_positions", max_positions)

    return arch


# Dufter & Schuetze's BERT-small (BERT-base divided by 12) and BERT-base ("overparam"); Conneau et al.'s encoder.
_architecture("xmlm_bert_small", layers=12, dim=64, heads=1, ffn=256)
_architecture("xmlm_bert_base", layers=12, dim=768, heads=12, ffn=3072)
_architecture("xmlm_conneau", layers=8, dim=768, heads=12, ffn=3072, max_positions=256)
