"""Attention's one door (vit_rope.layers.attention): every kind reaches a block through one ``encoding`` argument,
RoPE tables ``(cos, sin)``, a ``BlockInput`` or ``None``, and attention holds nothing of any kind unless the kind put
it there (``attach_``)."""

import inspect

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from vit_rope.encodings import KINDS
from vit_rope.layers.attention import NO_INPUT, BlockInput, RoPEAttention, RoPEBlock, block_input

OPTIONS = {"comrope_ap": {"block_size": 4}, "comrope_ld": {"block_size": 4}, "liere": {"generator_dim": 4},
           "pape": {"parabolas": 3}}


def test_attention_and_block_take_one_encoding_argument():
    for forward in (RoPEAttention.forward, RoPEBlock.forward):
        assert list(inspect.signature(forward).parameters) == ["self", "x", "encoding", "attn_mask", "is_causal"]
    attn = RoPEAttention(32, num_heads=2)
    timm_children = ("qkv", "q_norm", "k_norm", "attn_drop", "norm", "proj", "proj_drop")
    assert not [name for name, _ in attn.named_children() if name not in (*timm_children, "v_norm")]  # v_norm: Gemma 4
    tables = (torch.ones(1, 5, 8), torch.zeros(1, 5, 8))
    assert block_input(None) is NO_INPUT and block_input(NO_INPUT) is NO_INPUT
    rotation = block_input(tables)
    assert type(rotation) is BlockInput and rotation.rope is tables and rotation.bias is None


@pytest.mark.parametrize("kind", KINDS)
def test_every_kind_hands_each_block_tables_a_block_input_or_nothing(kind):
    """The model calls each block with what its encoding gives it, whatever the kind: the RoPE kinds tables (the
    fused kernels' path), STRING and every other kind a ``BlockInput``, no encoding nothing."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", encoding=kind, img_size=32, patch_size=8,
                              embed_dim=32, num_heads=2, depth=2, encoding_options=OPTIONS.get(kind)).eval()
    seen = []
    model.blocks[1].register_forward_pre_hook(lambda blk, args, kwargs: seen.append(kwargs["encoding"]),
                                              with_kwargs=True)
    x = torch.randn(2, 3, 32, 40)
    with torch.no_grad():
        model(x)
    (encoding,) = seen
    if kind == "none":
        assert encoding is None
    elif kind in ("axial", "mixed", "golden", "dinov3"):
        assert isinstance(encoding, tuple) and len(encoding) == 2
    else:
        assert isinstance(encoding, BlockInput)
