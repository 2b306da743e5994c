"""The fused q/k rotation (``vit_rope.layers.fused``) against the reference ``apply_rope``: values, gradients, memory,
the in-place inference path, and the model paths that use each (eager attention, torch.compile).

Both backends are held to the reference: PyTorch, and the Triton kernels (``vit_rope.layers.triton_rope``), which run
compiled on CUDA and through Triton's interpreter on CPU."""

import re

import pytest
import timm
import torch

import vit_rope  # noqa: F401  (registers the models)
from benchmarks.throughput import activation_bytes  # the benchmark's own measure, so both agree
from helpers.autograd import SavedForBackward
from vit_rope.encodings.base import image_positions
from vit_rope.encodings.rope.tables import RoPE2D
from vit_rope.layers import triton_rope
from vit_rope.layers.fused import project_rotate_qk, rotate_heads_, rotate_qk
from vit_rope.layers.rotary import apply_rope, rope_angles, rope_tables

B, N, NH, D = 2, 7, 3, 8
DEVICES = ["cpu", "cuda"]  # "cuda" is marked and skipped without a GPU by conftest.py
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
BACKENDS = ["torch"] + (["triton"] if triton_rope.AVAILABLE else [])
TOLERANCES = {torch.float64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}  # ~2.5 ulp


def qkv_attention(fast: bool, lin: torch.Tensor, freqs: torch.Tensor, positions: torch.Tensor, prefix: int,
                  temperature: float, backend: str = "torch") -> torch.Tensor:
    """q, k, v ``[3, B, nh, P+N, D]`` from a qkv projection output, rotated by the fast or the reference path."""
    cos, sin = (table * temperature for table in rope_tables(rope_angles(positions, freqs), prefix))
    qkv = (lin * 1).reshape(B, N + prefix, 3, NH, D)  # * 1: a non-leaf, as a Linear output
    if fast:  # the gradient arriving at the rotation is permuted (strided), as from attention
        return rotate_qk(qkv, cos, sin, backend).permute(2, 0, 3, 1, 4)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    return torch.stack((apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))


def inputs(kind: str, prefix: int, batched: bool, dtype: torch.dtype, device: str):
    torch.manual_seed(0)
    freqs = RoPE2D(D, NH, kind).freqs.detach().to(device).requires_grad_(kind == "mixed")
    positions = torch.randn(*((B,) if batched else ()), N, 2, device=device) * 4
    lin = torch.randn(B, N + prefix, 3 * NH * D, device=device, dtype=dtype, requires_grad=True)
    return lin, freqs, positions


@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("batched", [False, True], ids=["shared-positions", "per-image-positions"])
def test_gradients_are_exact_in_fp64(kind, prefix, batched):
    lin, freqs, positions = inputs(kind, prefix, batched, torch.float64, "cpu")
    freqs = freqs.double().detach().requires_grad_(kind == "mixed")
    for temperature in (1.0, 1.3):  # yarn scales the tables: the recovered x must divide |t|^2 out
        def fast(lin, freqs, temperature=temperature):
            return qkv_attention(True, lin, freqs, positions.double(), prefix, temperature)

        # fast mode: the Jacobian against a random projection (every entry counts) in two passes, not one per input
        assert torch.autograd.gradcheck(fast, (lin, freqs), fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["axial", "mixed", "dinov3"])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("batched", [False, True], ids=["shared-positions", "per-image-positions"])
def test_fast_path_equals_reference(backend, device, dtype, kind, prefix, batched):
    lin, freqs, positions = inputs(kind, prefix, batched, dtype, device)
    weight = torch.randn(3, B, NH, N + prefix, D, device=device)
    outputs, grads = [], []
    temperature = 1.3  # as yarn sets it: |t| != 1, so the table gradient must divide |t|^2 out
    for fast in (True, False):
        out = qkv_attention(fast, lin, freqs, positions, prefix, temperature, backend)
        (out.float() * weight).sum().backward()
        outputs.append(out.float())
        grads.append([lin.grad.float()] + ([freqs.grad] if kind == "mixed" else []))
        lin.grad = freqs.grad = None
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(outputs[0], outputs[1], atol=tol, rtol=tol)
    for fast_grad, ref_grad in zip(*grads, strict=True):
        scale = ref_grad.abs().max()
        torch.testing.assert_close(fast_grad / scale, ref_grad / scale, atol=tol, rtol=tol)
    if prefix:  # identity rows (times the temperature): prefix q and k are only scaled, exactly
        q_in = lin.detach().reshape(B, N + prefix, 3, NH, D)[:, 0, 0]
        # Triton's interpreter truncates fp32 -> bf16, where compiled kernels and PyTorch round to nearest: 1 ulp
        ulp = 2**-7 if backend == "triton" and device == "cpu" and dtype == torch.bfloat16 else 0
        expected = (q_in.float() * temperature).to(dtype).float()
        torch.testing.assert_close(outputs[0][0, :, :, 0], expected, atol=0, rtol=ulp)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", ["axial", "mixed", "dinov3"])
def test_inference_rotates_in_place_and_equals_reference(backend, device, dtype, kind):
    lin, freqs, positions = inputs(kind, 1, False, dtype, device)
    with torch.no_grad():
        expected = qkv_attention(False, lin, freqs, positions, 1, 1.0)
        qkv = lin.detach().clone().reshape(B, N + 1, 3, NH, D)
        out = rotate_qk(qkv, *rope_tables(rope_angles(positions, freqs), 1), backend=backend)
    assert out.data_ptr() == qkv.data_ptr()  # nothing allocated: the projection output is rotated where it is
    tol = TOLERANCES[dtype]
    torch.testing.assert_close(out.permute(2, 0, 3, 1, 4).float(), expected.float(), atol=tol, rtol=tol)


class Projection(torch.nn.Module):
    """An attention's qkv projection and rotation: ``project_rotate_qk``, or the Linear then the reference."""

    def __init__(self, fused: bool, backend: str = "torch", dim: int = 5):
        super().__init__()
        self.qkv = torch.nn.Linear(dim, 3 * NH * D)
        self.fused, self.backend = fused, backend

    def forward(self, x: torch.Tensor, freqs: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """q, k, v ``[3, B, nh, N, D]``, with one prefix token and yarn's temperature (|t| != 1)."""
        cos, sin = (table * 1.3 for table in rope_tables(rope_angles(positions, freqs), 1))
        if self.fused:
            with SavedForBackward() as saved:
                qkv = project_rotate_qk(self.qkv, x, NH, cos, sin, self.backend)
            with SavedForBackward() as projection:
                self.qkv(x)
            # rotated in place: beyond the tables and the output, it keeps what the projection alone keeps (its input
            # and weight, or their autocast copies), where the reference keeps q and k before and after the rotation
            assert saved.beyond(cos, sin, qkv) <= projection.beyond()
            return qkv.permute(2, 0, 3, 1, 4)
        q, k, v = self.qkv(x).unflatten(-1, (3, NH, D)).permute(2, 0, 3, 1, 4).unbind(0)
        return torch.stack((apply_rope(q, cos, sin), apply_rope(k, cos, sin), v))


@pytest.mark.parametrize("batched", [False, True], ids=["shared-positions", "per-image-positions"])
def test_projection_node_has_exact_gradients_in_fp64(batched):
    _, freqs, positions = inputs("mixed", 1, batched, torch.float64, "cpu")
    freqs = freqs.double().detach().requires_grad_()
    module = Projection(fused=True).double()
    x = torch.randn(B, N + 1, 5, dtype=torch.float64, requires_grad=True)

    def fast(x, weight, bias, freqs):
        params = {"qkv.weight": weight, "qkv.bias": bias}
        return torch.func.functional_call(module, params, (x, freqs, positions.double()))

    assert torch.autograd.gradcheck(fast, (x, module.qkv.weight, module.qkv.bias, freqs), fast_mode=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("batched", [False, True], ids=["shared-positions", "per-image-positions"])
def test_projection_node_equals_linear_then_reference(backend, device, autocast, kind, batched):
    _, freqs, positions = inputs(kind, 1, batched, torch.float32, device)
    x = torch.randn(B, N + 1, 16, device=device, requires_grad=True)
    weight = torch.randn(3, B, NH, N + 1, D, device=device)
    fused = Projection(fused=True, backend=backend, dim=16).to(device)
    reference = Projection(fused=False, dim=16).to(device)
    reference.load_state_dict(fused.state_dict())
    results = []
    for module in (fused, reference):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=autocast):
            out = module(x, freqs, positions)
        (out.float() * weight).sum().backward()
        params = [module.qkv.weight, module.qkv.bias] + ([freqs] if kind == "mixed" else [])
        results.append([out, x.grad] + [p.grad for p in params])
        x.grad = freqs.grad = None
    assert results[0][0].dtype == results[1][0].dtype == (torch.bfloat16 if autocast else torch.float32)
    tol = TOLERANCES[torch.bfloat16 if autocast else torch.float32]
    for fast, ref in zip(*results, strict=True):
        scale = ref.float().abs().max()
        torch.testing.assert_close(fast.float() / scale, ref.float() / scale, atol=tol, rtol=tol)


def test_a_hooked_projection_calls_the_linear_so_its_hooks_see_its_output_and_gradient():
    """Hooks (or a Linear subclass) see the projection as it is: the Linear is called, so its forward and backward
    hooks, or a hook for every module, run and see its output and gradient, as without RoPE; the rotation then follows,
    with the reference's values and gradient."""
    _, freqs, positions = inputs("mixed", 1, False, torch.float32, "cpu")
    module, reference = Projection(fused=True), Projection(fused=False)
    reference.load_state_dict(module.state_dict())
    seen, called = [], []
    module.qkv.register_forward_hook(lambda _module, _args, output: seen.append(output.shape))
    module.qkv.register_full_backward_hook(lambda _module, _grad_in, grad_out: seen.append(grad_out[0].shape))
    x = torch.randn(B, N + 1, 5, requires_grad=True)
    cos, sin = (table * 1.3 for table in rope_tables(rope_angles(positions, freqs), 1))
    out = project_rotate_qk(module.qkv, x, NH, cos, sin)
    expected, weights = reference(x, freqs, positions), torch.randn(3, B, NH, N + 1, D)
    torch.testing.assert_close(out.permute(2, 0, 3, 1, 4), expected)
    grads = [torch.autograd.grad((qkv * weights).sum(), x)[0] for qkv in (out.permute(2, 0, 3, 1, 4), expected)]
    torch.testing.assert_close(grads[0], grads[1])
    assert seen == [(B, N + 1, 3 * NH * D)] * 2  # the output, then the gradient arriving at it
    handle = torch.nn.modules.module.register_module_forward_hook(lambda module, args, out: called.append(module))
    try:
        project_rotate_qk(module.qkv, x, NH, cos, sin).sum().backward()
    finally:
        handle.remove()
    assert called == [module.qkv]


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend 'cuda': choose one of auto, torch, triton"):
        rotate_qk(torch.zeros(1, 2, 3, 1, 4), torch.ones(1, 2, 2), torch.zeros(1, 2, 2), backend="cuda")


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_training_memory_matches_the_model_without_rope(kind):
    """The fused rotation adds no activation: RoPE costs only its per-block tables, which do not grow with the batch
    (within +3% at batch 8, the benchmark's batch; axial tables are shared, so axial is within 0.1%)."""
    x = torch.randn(8, 3, 96, 96)
    kwargs = dict(depth=4, num_classes=10, img_size=96)
    rope = timm.create_model(f"vit_rope_tiny_patch16_{kind}_224", **kwargs)
    ape = timm.create_model("vit_tiny_patch16_224", init_values=1e-5, no_embed_class=True, **kwargs)
    ratio = activation_bytes(rope, lambda: rope(x).sum()) / activation_bytes(ape, lambda: ape(x).sum())
    limit = 1.03 if kind == "mixed" else 1.001
    assert ratio <= limit, f"{kind} RoPE saves {ratio:.3f}x the activations of the same ViT without RoPE"


@pytest.mark.parametrize("name", ["vit_rope_tiny_patch16_mixed_224", "vit_rope_small_plus_patch16_dinov3_qkvb"])
def test_model_fast_and_reference_paths_agree(monkeypatch, name):
    """Eager models use the in-place path; traced ones (torch.compile) the reference: same logits and gradients."""
    torch.manual_seed(0)
    model = timm.create_model(name, depth=2, num_classes=5, drop_path_rate=0.0, embed_dim=192, num_heads=3,
                              init_values=1.0)
    x = torch.randn(2, 3, 64, 48)
    results = []
    for compiling in (False, True):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda compiling=compiling: compiling)
        model.zero_grad()
        out = model(x)
        out.square().sum().backward()
        results.append((out, [p.grad.clone() for p in model.parameters()]))
    torch.testing.assert_close(results[0][0], results[1][0], atol=1e-5, rtol=1e-5)
    for fast, ref in zip(results[0][1], results[1][1], strict=True):
        torch.testing.assert_close(fast, ref, atol=1e-5, rtol=1e-4)


class KeepsOutput(torch.nn.Module):
    """A norm that keeps its last output, as a module of its own: a forward hook would hold the output, which makes
    the attention rotate out of place."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.norm, self.output = norm, None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.output = self.norm(x)
        return self.output


@pytest.mark.parametrize("num_kv_heads", [3, 1], ids=["mha", "gqa"])
def test_qk_norm_rotates_the_normed_q_and_k_in_place_in_inference(num_kv_heads):
    """With q/k norms RoPE must rotate the normalised q and k, which the projection's in-place path cannot: training
    takes the reference, inference rotates the norms' outputs where they are (unless a hook holds them, or a norm is
    an Identity passing on a view of the projection); all equal the reference."""
    torch.manual_seed(0)
    model = timm.create_model("vit_rope_tiny_patch16_axial_224", depth=1, num_classes=5, qk_norm=True)
    attn = model.blocks[0].attn
    if num_kv_heads != attn.num_heads:
        attn.group_kv_heads_(num_kv_heads)
    assert not attn.plain_qk
    attn.q_norm = q_norm = KeepsOutput(attn.q_norm)
    x = torch.randn(2, 17, 192)
    positions = image_positions(model.pos_encoding[0], 4, 4)
    rope = model.pos_encoding[0](positions.coords, 1, positions.grids)
    plain_q, plain_k, _ = attn.project(x)
    expected = apply_rope(plain_q, *rope), apply_rope(plain_k, *rope)

    def rotated_in_place(q: torch.Tensor) -> bool:
        """Whether ``q`` is the norm's output, overwritten (else the norm's output still holds the unrotated q)."""
        if q.data_ptr() == q_norm.output.data_ptr():
            return True
        assert torch.equal(q_norm.output, plain_q)
        return False

    results = {"training": attn.project(x, rope)}
    assert results["training"][0].grad_fn is not None and not rotated_in_place(results["training"][0])
    with torch.no_grad():
        results["inference"] = attn.project(x, rope)
        assert rotated_in_place(results["inference"][0])  # the norm's output, rotated there
        held = []
        handle = q_norm.register_forward_hook(lambda module, args, out: held.append(out))
        results["hooked norm"] = attn.project(x, rope)
        handle.remove()
        assert not rotated_in_place(results["hooked norm"][0]) and torch.equal(held[0], plain_q)  # what it holds
        k_norm, attn.k_norm = attn.k_norm, torch.nn.Identity()
        results["one norm"] = attn.project(x, rope)
        attn.k_norm = k_norm
        assert not rotated_in_place(results["one norm"][0])
    for name, (q, k, _) in results.items():  # k of grouped heads: rotated, then repeated as project repeats it
        torch.testing.assert_close(q, expected[0], msg=name)
        if name != "one norm":
            torch.testing.assert_close(k, expected[1], msg=name)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("kind", ["axial", "mixed"])
@pytest.mark.parametrize("batched", [False, True], ids=["shared-positions", "per-image-positions"])
def test_rotate_heads_in_place_equals_reference(dtype, kind, batched):
    lin, freqs, positions = inputs(kind, 1, batched, dtype, "cpu")
    cos, sin = rope_tables(rope_angles(positions, freqs.detach()), 1)
    q, k = (lin.detach()[..., i * NH * D:(i + 1) * NH * D].unflatten(-1, (NH, D)).transpose(1, 2).contiguous()
            for i in range(2))  # [B, nh, P+N, D] each
    expected = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    out = rotate_heads_(q, k, cos, sin)
    assert out[0] is q and out[1] is k
    tol = TOLERANCES[dtype]
    for got, want in zip(out, expected, strict=True):
        torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_rotate_heads_refuses_a_layout_it_cannot_write_in_place():
    q = torch.randn(2, NH, N, D)
    k = torch.randn(2, NH, N, 2 * D)[..., ::2]  # channels two floats apart
    cos, sin = rope_tables(rope_angles(torch.randn(N, 2), RoPE2D(D, NH, "axial").freqs))
    with pytest.raises(ValueError, match=r"k of shape .* does not hold its channel pairs adjacent; rotate a"):
        rotate_heads_(q, k, cos, sin)


@pytest.mark.parametrize("kind", ["axial", "mixed"])
def test_compile_has_no_graph_break_and_recompiles_at_most_once_per_size(kind):
    torch._dynamo.reset()
    model = timm.create_model(f"vit_rope_tiny_patch16_{kind}_224", depth=1, num_classes=5)  # blocks trace alike
    compiles = []

    def backend(graph, example_inputs):
        compiles.append(graph)
        return graph.forward

    compiled = torch.compile(model, backend=backend)
    sizes = [64, 64, 96, 64]  # a size again at once, and after another
    for i, size in enumerate(sizes):
        compiled(torch.randn(1, 3, size, size)).sum().backward()
        assert i or len(compiles) == 1, f"{len(compiles)} graphs for one forward: a graph break"
    # the number of compilations is the property: one per size, none per call
    assert len(compiles) <= len(set(sizes)), f"{len(compiles)} compilations for {len(set(sizes))} sizes"


@pytest.mark.skipif(not triton_rope.AVAILABLE, reason="triton is not installed")
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_triton_kernel_compiles_for_hopper_with_16_byte_accesses(dtype):
    """The interpreter runs the kernel's Python; this compiles it to sm_90 (H100/H200), as a GPU would, which catches
    what only the compiler checks (layouts, types of the split/join tiles), on machines without one.

    Compiled as the JIT specialises a ViT-S call (head_dim 64; pointers and strides divisible by 16, the table's last
    stride 1, shared over the batch), every global load and store of the PTX is 16 bytes wide: the rotation is
    memory-bound, and a kernel addressing channel pairs one by one gets 4-byte accesses in bf16."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    kernel = triton_rope._rotate_kernel
    names = kernel.arg_names
    pointers = dict(src=dtype, dst=dtype, out=dtype, grad_cos="fp32", grad_sin="fp32", cos="fp32", sin="fp32")
    aligned = set(pointers) | {f"{t}_{s}" for t in "sdo" for s in ("b", "n", "3", "h")} | {"t_n", "t_h"}
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    variants = [(False, False, False), (False, True, False), (True, True, False), (True, True, True)]
    for conj, copy_v, table_grad in variants:  # inference in place, training forward, backward (table gradient)
        constexprs = dict(HALF=32, BLOCK_T=32, BLOCK_J=32, CONJ=conj, COPY_V=copy_v, TABLE_GRAD=table_grad,
                          t_b=0, t_j=1)
        signature = {name: "constexpr" if name in constexprs else f"*{pointers[name]}" if name in pointers else "i32"
                     for name in names}
        compiled = compile(ASTSource(kernel, signature, constexprs=constexprs, attrs=attrs),
                           target=GPUTarget("cuda", 90, 32))
        assert compiled.asm["cubin"]
        accesses = re.findall(r"\b(?:ld|st)\.global(?:\.[a-z0-9]+)*", compiled.asm["ptx"])
        assert accesses and all(".v4.b32" in access for access in accesses), sorted(set(accesses))


@pytest.mark.skipif(not triton_rope.AVAILABLE, reason="triton is not installed")
@pytest.mark.parametrize("head_dim", [12, 40])
def test_triton_masks_the_padding_of_a_head_dim_off_a_power_of_two(head_dim):
    """The kernel reads a head's channels as one tile padded to a power of two (6 pairs -> 8, 20 -> 32): the padding
    is masked, so the rotation, v and both gradients equal the PyTorch path, and the in-place rotation touches nothing
    past the head."""
    torch.manual_seed(0)
    freqs = RoPE2D(head_dim, NH, "mixed").freqs.detach()
    positions = torch.randn(N, 2) * 4
    lin = torch.randn(B, N + 1, 3, NH, head_dim)
    weight = torch.randn(B, N + 1, 3, NH, head_dim)
    results = []
    for backend in ("torch", "triton"):
        x, f = lin.clone().requires_grad_(), freqs.clone().requires_grad_()
        cos, sin = (table * 1.3 for table in rope_tables(rope_angles(positions, f), 1))
        out = rotate_qk(x * 1, cos, sin, backend)
        (out * weight).sum().backward()
        with torch.no_grad():
            in_place = rotate_qk(lin.clone(), cos, sin, backend)
        results.append((out, x.grad, f.grad, in_place))
    for triton_result, torch_result in zip(results[1], results[0], strict=True):  # gradients: sums in another order
        scale = torch_result.abs().max()
        torch.testing.assert_close(triton_result / scale, torch_result / scale, atol=1e-5, rtol=1e-5)
