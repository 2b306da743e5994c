"""NaFlex batches (vit_rope.models.embedding, vit_rope.layers.lattice): in one batch that mixes aspect ratios, padded
to one length, each sample's logits, features and gradients equal the same model on that image alone, for every kind of
position encoding and every resolution policy; padding changes nothing."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import pytest
import torch
from timm.data.naflex_transforms import patchify_image

import vit_rope.encodings.rope.tables as rope_module
from helpers.models import perturbed
from helpers.naflex import GRIDS, LENGTH, PATCH, images, pack
from vit_rope.encodings.ape import fit_pos_embed
from vit_rope.encodings.base import Positions
from vit_rope.encodings.policies import ResolutionPolicy, place_positions, policy_frequencies
from vit_rope.encodings.rope.rotary_encoding import RotaryEncoding
from vit_rope.layers.lattice import gather_rows as naflex_gather
from vit_rope.layers.lattice import lattice, naflex_grid, pos_embed_at

BASE = dict(img_size=80, embed_dim=32, depth=2, num_heads=2, num_classes=7, init_values=0.5)
KINDS = {  # name -> (model, extra kwargs, policies; none: its samples are test_lookhere_alibi.py's)
    "axial": ("vit_rope_tiny_patch16_axial_224", {}, ("extrapolate", "interpolate", "ntk", "yarn", "normalized")),
    "mixed": ("vit_rope_tiny_patch16_mixed_224", {}, ("extrapolate", "interpolate", "ntk", "yarn")),
    "axial_ape": ("vit_rope_tiny_patch16_axial_ape_224", {}, ("extrapolate", "interpolate")),
    "mixed_ape_cls": ("vit_rope_tiny_patch16_mixed_ape_224", {"no_embed_class": False}, ("extrapolate",)),
    "dinov3": ("vit_rope_tiny_patch16_axial_224", {"encoding": "dinov3", "reg_tokens": 2, "global_pool": "avg"},
               ("normalized", "extrapolate")),
    "dinov3_min": ("vit_rope_tiny_patch16_axial_224", {"encoding": "dinov3", "rope_normalize_coords": "min"},
                   ("normalized",)),
    "pe_offset": ("vit_rope_pe_spatial_tiny_patch16_512", {}, ("interpolate", "extrapolate", "normalized")),
    "golden": ("vit_rope_tiny_patch16_golden_224", {}, ("extrapolate", "yarn")),
    "string_mixed": ("vit_rope_tiny_patch16_string_mixed_224", {}, ("extrapolate", "interpolate")),
    "lh45_regs": ("vit_rope_tiny_patch16_lookhere_224", {"encoding_options": {"config": "lh45"}, "reg_tokens": 2,
                                                         "embed_dim": 48, "num_heads": 3}, ()),
}
CASES = [(kind, policy) for kind, (_, _, policies) in KINDS.items() for policy in policies]


def build(kind: str, policy: str = "extrapolate", **kwargs) -> torch.nn.Module:
    name, extra, _ = KINDS[kind]
    return perturbed(name, policy, **{**BASE, **extra, **kwargs})


@pytest.mark.parametrize("kind,policy", CASES)
def test_each_sample_of_a_mixed_batch_equals_its_image_alone(kind: str, policy: str) -> None:
    model, inputs = build(kind, policy), images()
    batch = pack(inputs)
    with torch.no_grad():
        logits = model(batch)
        tokens = model.forward_features(batch)
        pooled = model.forward_head(tokens, pre_logits=True, patch_valid=batch["patch_valid"])
        P = model.num_prefix_tokens
        for b, image in enumerate(inputs):
            n = int(batch["patch_valid"][b].sum())
            alone = model.forward_features(image[None])
            torch.testing.assert_close(tokens[b, :P + n], alone[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(pooled[b], model.forward_head(alone, pre_logits=True)[0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(logits[b], model(image[None])[0], rtol=1e-4, atol=1e-4)
    assert logits.abs().max() > 0.1  # the comparison is not between two near-zero outputs


@pytest.mark.parametrize("kind,policy", [("mixed", "interpolate"), ("mixed", "extrapolate"),
                                         ("axial_ape", "interpolate"), ("dinov3", "normalized"),
                                         ("lh45_regs", "interpolate")])
def test_gradients_of_a_mixed_batch_are_the_sum_of_each_images(kind: str, policy: str) -> None:
    """``extrapolate``: the tables are gathered from the batch's lattice, and so are their gradients; LookHere's
    bias, through its register tokens too."""
    inputs = images()
    model = build(kind, policy).train()
    batch = pack(inputs)
    batch["patches"].requires_grad_(True)
    model(batch).square().sum().backward()
    together = {name: param.grad.clone() for name, param in model.named_parameters()}
    model.zero_grad()
    alone = [image.clone().requires_grad_(True) for image in inputs]
    sum(model(image[None]).square().sum() for image in alone).backward()
    for name, param in model.named_parameters():  # to 1e-4 of each gradient's largest entry
        scale = float(param.grad.abs().max())
        torch.testing.assert_close(together[name], param.grad, rtol=1e-4, atol=1e-4 * scale, msg=name)
    for b, image in enumerate(alone):  # the input gradient, patch by patch, and nothing into the padding
        n = int(batch["patch_valid"][b].sum())
        flat = patchify_image(image.grad, (PATCH, PATCH), include_info=False)
        torch.testing.assert_close(batch["patches"].grad[b, :n], flat, rtol=1e-4, atol=1e-4 * float(flat.abs().max()))
        assert batch["patches"].grad[b, n:].abs().max() == 0


def test_the_forms_of_a_batch_agree_and_padding_changes_nothing() -> None:
    model, inputs = build("mixed", "yarn"), images()
    batch = pack(inputs)
    with torch.no_grad():
        as_dict = model(batch)
        as_kwargs = model(batch["patches"], patch_coord=batch["patch_coord"], patch_valid=batch["patch_valid"])
        longer = model(pack(inputs, length=LENGTH + 9, pad_value=5.0))
        full = pack([inputs[2]], length=25)  # the 5x5 image, no padding
        assert full["patch_valid"].all()
        one = model(full)
    torch.testing.assert_close(as_kwargs, as_dict, rtol=0, atol=0)
    torch.testing.assert_close(longer, as_dict, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one[0], as_dict[2], rtol=1e-4, atol=1e-4)


def test_intermediates_of_a_batch_are_each_images_maps() -> None:
    model, inputs = build("axial", "interpolate"), images()
    batch = pack(inputs)
    with torch.no_grad():
        maps = model.forward_intermediates(batch, indices=[0, 1], intermediates_only=True)
        tokens = model.forward_intermediates(batch, output_fmt="NLC", output_dict=True)
        for b, (image, (h, w)) in enumerate(zip(inputs, GRIDS, strict=True)):
            for ours, theirs in zip(maps, model.forward_intermediates(image[None], intermediates_only=True),
                                    strict=True):
                assert ours.shape[-2:] == (6, 6)  # the batch's largest grid on each axis
                torch.testing.assert_close(ours[b, :, :h, :w], theirs[0], rtol=1e-4, atol=1e-4)
                assert ours[b, :, h:].abs().sum() == 0 and ours[b, :, :, w:].abs().sum() == 0
    assert tokens["patch_valid"].equal(batch["patch_valid"]) and tokens["patch_coord"].equal(batch["patch_coord"])
    assert tokens["image_intermediates"][0].shape == (3, LENGTH, BASE["embed_dim"])


def test_intermediate_tokens_carry_the_coordinates_patch_dropout_kept() -> None:
    model, inputs = build("mixed", patch_drop_rate=0.5).train(), images()
    batch = pack(inputs)
    torch.manual_seed(3)
    out = model.forward_intermediates(batch, indices=1, output_fmt="NLC", output_dict=True)
    tokens, coord, valid = out["image_intermediates"][0], out["patch_coord"], out["patch_valid"]
    assert tokens.shape[1] == coord.shape[1] == valid.shape[1] < LENGTH
    for b in range(len(inputs)):  # every kept token is one of the sample's tokens, each kept once
        pairs = {tuple(yx) for yx, ok in zip(batch["patch_coord"][b].tolist(), batch["patch_valid"][b], strict=True)
                 if ok}
        kept = [tuple(yx) for yx, ok in zip(coord[b].tolist(), valid[b], strict=True) if ok]
        assert set(kept) <= pairs and len(set(kept)) == len(kept)
    with pytest.raises(ValueError, match=r"Patch dropout \(patch_drop_rate=0.5\).*output_fmt='NLC'"):
        model.forward_intermediates(batch, indices=1)  # NCHW maps of dropped tokens, as for images


def test_coordinate_augmentation_draws_per_sample() -> None:
    model = build("mixed", rope_coord_aug={"rescale": 2.0})
    same = images([(5, 5)]) * 2
    batch = pack(same)
    with torch.no_grad():
        model.train()
        trained = model(batch)
        model.eval()
        evaluated = model(batch)
    assert not torch.allclose(trained[0], trained[1])  # one draw per image
    torch.testing.assert_close(evaluated[0], evaluated[1])  # none in evaluation


@pytest.mark.parametrize("grid", [(1, 1), (3, 7), (5, 5), (9, 4), (17, 30)])
def test_per_token_position_embedding_equals_the_resampled_table(grid: tuple[int, int]) -> None:
    torch.manual_seed(0)
    table = torch.randn(1, 25, 8)
    h, w = grid
    coord = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij"), -1).reshape(1, -1, 2)
    ours = pos_embed_at(table[0], coord, torch.tensor([[h, w]]), (5, 5))
    torch.testing.assert_close(ours[0], fit_pos_embed(table, grid, (5, 5), 0)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["interpolate", "ntk", "yarn"])
def test_per_sample_frequencies_are_the_policys_on_each_grid(policy: str) -> None:
    torch.manual_seed(0)
    freqs = torch.randn(2, 2, 8)
    grids = torch.tensor([[4, 6], [6, 3], [5, 5], [10, 12]])
    values = ResolutionPolicy(policy)
    batched, temperature = policy_frequencies(freqs, grids, (5, 5), values, 10.0, 32)
    for b in range(len(grids)):  # each sample's frequencies are those of its grid alone (an image batch's)
        single, t = policy_frequencies(freqs, grids[b:b + 1], (5, 5), values, 10.0, 32)
        torch.testing.assert_close(batched[b], single[0], rtol=1e-6, atol=1e-7)
        assert (temperature is None and t is None) or abs(float(temperature[b]) - float(t)) < 1e-6


def test_grid_and_positions_ignore_padding() -> None:
    batch = pack(images())
    grid = naflex_grid(batch["patch_coord"], batch["patch_valid"])
    assert grid.tolist() == [list(g) for g in GRIDS]
    positions = place_positions(batch["patch_coord"], grid, "axial", "extrapolate", (5, 5))
    assert positions[0, :24].tolist()[:7] == [[x, 0.0] for x in range(6)] + [[0.0, 1.0]]


def test_the_lattice_names_each_tokens_cell_of_the_bounding_grid() -> None:
    batch = pack(images())
    coord, valid = batch["patch_coord"], batch["patch_valid"]
    rows, grid = lattice(coord, valid, naflex_grid(coord, valid), 2)
    assert grid == (6, 6)  # 4x6, 6x3, 5x5
    assert rows[:, :2].eq(0).all()  # prefix tokens: the identity row
    expected = (1 + coord[..., 0] * 6 + coord[..., 1]).masked_fill(~valid, 1)  # padding: the cell (0, 0)
    assert rows[:, 2:].equal(expected) and rows[0, 2 + 23] == 1 + 3 * 6 + 5
    shifted = coord + torch.tensor([1, 2])  # a crop of a larger image: still on the lattice, a larger box
    assert lattice(shifted, valid, naflex_grid(shifted, valid), 0).grid == (7, 8)
    wide = pack(images([(1, 8), (8, 1)]), length=8)  # an 8x8 box for 16 tokens: tables per token are cheaper
    wide_grid = naflex_grid(wide["patch_coord"], wide["patch_valid"])
    assert lattice(wide["patch_coord"], wide["patch_valid"], wide_grid, 1) is None


@pytest.mark.parametrize("kind,offset", [("axial", 0.0), ("mixed", 0.0), ("golden", 0.0), ("mixed", 1.0)])
@pytest.mark.parametrize("policy", ["extrapolate", "interpolate"])
def test_tables_gathered_from_the_lattice_equal_tables_per_token(kind: str, offset: float, policy: str,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Values and the frequencies' gradient; the lattice serves ``extrapolate`` only, other policies scale each
    sample's frequencies and build tables per token."""
    torch.manual_seed(0)
    encoding = RotaryEncoding(1, kind == "mixed", head_dim=16, num_heads=2, kind=kind, train_grid=(5, 5),
                              policy=policy, grid_offset=offset, fraction=0.75).double()
    rope = encoding[0]
    batch = pack(images())
    coord, valid = batch["patch_coord"], batch["patch_valid"]
    grid = naflex_grid(coord, valid)
    positions = encoding.place(coord, grid).double()
    # the count is the property: on the lattice (extrapolate only) the bounding grid's tables are built once and each
    # token's row gathered, cos and sin, in training and in inference; other policies build tables per token
    gathered = []
    monkeypatch.setattr(rope_module, "gather_rows", lambda t, r: gathered.append(r) or naflex_gather(t, r))
    weights = torch.randn(2, 3, 2, 2 + LENGTH, 8, dtype=torch.float64)

    def tables(lattice_: Callable | None) -> tuple[torch.Tensor, ...]:
        rope.freqs.grad = None
        rope.freqs.requires_grad_(kind == "mixed")
        cos, sin = encoding.block_inputs(Positions(positions, grid, None, valid, lattice_), 2)[0]
        if kind == "mixed":
            (cos * weights[0] + sin * weights[1]).sum().backward()
        return cos, sin, rope.freqs.grad

    per_token = tables(None)
    assert not gathered
    on_lattice = tables(partial(lattice, coord, valid, grid, 2))
    with torch.no_grad():  # inference: the bounding grid's tables from one table per axis
        on_grid = Positions(positions, grid, None, valid, partial(lattice, coord, valid, grid, 2))
        inference = encoding.block_inputs(on_grid, 2)[0]
    assert len(gathered) == (4 if policy == "extrapolate" else 0)
    for mine, theirs in zip((*on_lattice, *inference), (*per_token, *per_token[:2]), strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-12, atol=1e-12)
    assert per_token[1][:, :, 2:].abs().max() > 0.1 and (kind != "mixed" or per_token[2].abs().max() > 0)


def test_a_bad_batch_is_refused_naming_what_it_needs() -> None:
    model, batch = build("axial"), pack(images())
    with pytest.raises(ValueError, match="patch_coord, patch_valid missing from"):
        model({"patches": batch["patches"]})
    with pytest.raises(ValueError, match="patch_valid missing from"):
        model({"patches": batch["patches"], "patch_coord": batch["patch_coord"]})
    with pytest.raises(ValueError, match=r"\(3, 32, 768\) came with patch_coord but without patch_valid"):
        model(batch["patches"], patch_coord=batch["patch_coord"])
    with pytest.raises(ValueError, match="patch embedding takes 768"):
        model(batch["patches"][..., :100], patch_coord=batch["patch_coord"], patch_valid=batch["patch_valid"])
    with pytest.raises(ValueError, match=r"patch_valid \(3, 32\) was given without patch_coord"):
        model(batch["patches"], patch_valid=batch["patch_valid"])
    with pytest.raises(ValueError, match=r"patch_valid must be \[B, N\] = \(3, 32\).*got \(3, 31\)"):
        model({**batch, "patch_valid": batch["patch_valid"][:, 1:]})
    moved = batch["patch_coord"].clone()
    moved[1, 4] = torch.tensor([2, -1])
    with pytest.raises(ValueError, match=r"negative \(y, x\) = \(2, -1\) at sample 1, token 4"):
        model({**batch, "patch_coord": moved})
    moved[1, 4], moved[2, -1] = torch.tensor([0, 1]), torch.tensor([-5, -5])  # padding may hold anything
    model({**batch, "patch_coord": moved})
    empty = batch["patch_valid"].clone()
    empty[2] = False
    with pytest.raises(ValueError, match=r"no valid token in sample\(s\) \[2\]"):
        model.forward_features({**batch, "patch_valid": empty})
    with pytest.raises(ValueError, match=r"tensor \(3, 32, 768\) reads as NaFlex patches, which need patch_coord"):
        model.forward_intermediates(batch["patches"])
    with pytest.raises(ValueError, match="patch_coord must hold integer patch indices .*torch.float32"):
        model({**batch, "patch_coord": batch["patch_coord"] + 0.5})
    with pytest.raises(ValueError, match=r"attn_mask \(3, 1, 1, 32\) does not fit the batch's 3 samples of 33 tokens"):
        model({**batch, "attn_mask": batch["patch_valid"][:, None, None, :]})


def test_a_given_attention_mask_replaces_the_padding_mask_and_an_empty_batch_gives_empty_outputs() -> None:
    model, batch = build("axial"), pack(images())
    keys = torch.cat((torch.ones(3, 1, dtype=torch.bool), batch["patch_valid"]), dim=1)  # the class token, patches
    with torch.no_grad():
        torch.testing.assert_close(model({**batch, "attn_mask": keys[:, None, None, :]}), model(batch), rtol=0, atol=0)
        square = keys[:, None, None, :].repeat(1, 1, keys.shape[1], 1)  # [B, 1, T, T]: the same key mask per query
        square[:, :, 1:, 0] = False  # and the class token hidden from the patches
        changed = model({**batch, "attn_mask": square})
        assert changed.isfinite().all() and (changed - model(batch)).abs().max() > 1e-3
        nothing = {key: value[:0] for key, value in batch.items() if key != "seq_len"}
        assert model(nothing).shape == (0, BASE["num_classes"])
        assert model.forward_intermediates(nothing, intermediates_only=True)[0].shape == (0, BASE["embed_dim"], 0, 0)


def test_compiled_model_equals_eager_on_batches_of_other_grids() -> None:
    """Inductor (the suite's one run of it) on NaFlex batches. Its C++ is scalar here: the graph and every op's
    lowering are the same as with vector code, whose g++ build takes three times as long on a cold cache."""
    model = build("mixed", "interpolate", depth=1)  # one block: the graph of every block is the same
    compiled = torch.compile(model, dynamic=False)
    with torch.no_grad(), torch._inductor.config.patch({"cpp.vec_isa_ok": False}):
        for grids in (GRIDS, [(2, 8), (5, 1), (4, 4)]):
            batch = pack(images(grids))
            torch.testing.assert_close(compiled(batch), model(batch), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind,policy", [("axial_ape", "interpolate"), ("dinov3", "normalized"), ("golden", "yarn"),
                                         ("string_mixed", "extrapolate")])
def test_compiled_training_step_equals_eager_for_other_kinds(kind: str, policy: str) -> None:
    """Logits and every parameter's gradient of a NaFlex training step, compiled and eager (one block: the graph of
    every block is the same). The kinds differ in what is traced (positions, policies, tables), which ``aot_eager``'s
    forward and backward graphs check; inductor's code generation of a NaFlex batch is the test above's."""
    model = build(kind, policy, depth=1).train()
    compiled = torch.compile(model, dynamic=False, backend="aot_eager")
    batch = pack(images())
    grads = []
    for runner in (model, compiled):
        model.zero_grad()
        logits = runner(batch)
        logits.square().sum().backward()
        grads.append((logits.detach(), {name: param.grad.clone() for name, param in model.named_parameters()}))
    (eager, eager_grads), (ours, ours_grads) = grads
    torch.testing.assert_close(ours, eager, rtol=1e-4, atol=1e-4)
    for name, grad in eager_grads.items():
        torch.testing.assert_close(ours_grads[name], grad, rtol=1e-4, atol=1e-4 * float(grad.abs().max()), msg=name)
