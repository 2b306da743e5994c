"""Probes of a frozen backbone beside its head: DINO's weighted kNN (Wu et al. 2018; Caron et al. 2021) and a linear
classifier fitted once, at one size, then evaluated at every size and policy (docs/evaluation.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vit_rope.errors import UserError

PROBES = ("head", "knn", "linear")


@dataclass(frozen=True)
class ProbeOptions:
    """What the harness evaluates and how the probes are built (docs/evaluation.md, "Probes")."""

    probes: tuple[str, ...] = ("head",)
    k: int = 20
    temperature: float = 0.07
    bank_size: int | None = None
    linear_size: int | None = None
    train_split: str = "train"
    train_limit: int | None = None

    def __post_init__(self) -> None:
        unknown = sorted(set(self.probes) - set(PROBES))
        if unknown or not self.probes:
            raise UserError(f"unknown probe {', '.join(unknown) or '(none)'}: choose from {', '.join(PROBES)}")
        if self.k < 1 or not self.temperature > 0:
            raise UserError(f"--knn-k {self.k} and --knn-temperature {self.temperature} must be positive: k is how "
                            "many train images vote (default 20), the temperature how sharply closer ones count (0.07)")

    @property
    def pooled(self) -> bool:
        """Whether any probe reads pooled features (and so the train split)."""
        return any(probe != "head" for probe in self.probes)


def model_outputs(model: nn.Module, inputs: Tensor | dict[str, Tensor], logits: bool = True, pooled: bool = True
                  ) -> tuple[Tensor | None, Tensor | None]:
    """Logits and/or pooled features ``[B, C]`` of images or a NaFlex batch in one pass, logits of those features."""
    if not pooled:
        return model(inputs), None
    if isinstance(inputs, dict):  # our ViT returns the padded tokens, timm's NaFlexViT a dict with their validity
        out = model.forward_features(inputs["patches"], patch_coord=inputs["patch_coord"],
                                     patch_valid=inputs["patch_valid"])
        tokens, valid = (out["patches"], out["patch_valid"]) if isinstance(out, dict) else (out, inputs["patch_valid"])
        extra = {"patch_valid": valid}  # pooling reads the valid tokens only
    else:
        tokens, extra = model.forward_features(inputs), {}
    features = model.forward_head(tokens, pre_logits=True, **extra)
    head = model.get_classifier() if logits else None
    if isinstance(head, tuple):  # a distilled DeiT's two heads, each of its own token
        return model.forward_head(tokens, **extra), features
    return (None if head is None else head(features)), features


def feature_width(model: nn.Module, label: str, size: int) -> int:
    """The width of ``model``'s pooled features, from one blank image before any data is read."""
    blank = torch.zeros(1, 3, size, size, device=next(model.parameters()).device)
    with torch.inference_mode():
        features = model_outputs(model.eval(), blank, logits=False)[1]
    if features.dim() != 2:
        raise UserError(f"{label} pools nothing: its pre-logits are {tuple(features.shape)} for one image (tokens or "
                        "a feature map, not a vector; global_pool=''), so no probe can read them; build it with "
                        "--model-kwargs global_pool=token (or avg, map)")
    return features.shape[1]


SIMILARITIES = 2**24  # floats of kNN similarities held at once (64 MiB): the query chunk is this over the bank's size


def knn_votes(bank: Tensor, bank_labels: Tensor, queries: Tensor, num_classes: int, k: int = 20,
              temperature: float = 0.07, chunk: int | None = None) -> Tensor:
    """DINO's weighted kNN: class scores ``[Q, num_classes]``, each query's ``k`` most cosine-similar bank images voting
    ``exp(similarity / temperature)``; queries go ``chunk`` at a time (default: 64 MiB of similarities, any bank)."""
    bank, k = F.normalize(bank.float(), dim=1), min(k, len(bank))
    chunk = chunk or max(1, SIMILARITIES // max(1, len(bank)))
    votes = []
    for part in F.normalize(queries.float(), dim=1).split(chunk):
        similarity, nearest = (part @ bank.T).topk(k, dim=1)  # [q, k], most similar first
        weights = (similarity / temperature).exp()
        votes.append(weights.new_zeros(len(part), num_classes).scatter_add_(1, bank_labels[nearest], weights))
    return torch.cat(votes) if votes else bank.new_zeros(0, num_classes)


@dataclass(frozen=True)
class LinearProbe:
    """A linear classifier on features standardised as those it was fitted on, so another size's take the same map."""

    mean: Tensor  # [C]
    std: Tensor  # [C]
    weight: Tensor  # [classes, C]
    bias: Tensor  # [classes]

    def __call__(self, features: Tensor) -> Tensor:
        return ((features.float() - self.mean) / self.std) @ self.weight.T + self.bias  # [B, classes]


def fit_linear(features: Tensor, labels: Tensor, num_classes: int, weight_decay: float = 1e-4) -> LinearProbe:
    """Multinomial logistic regression on standardised features, L2-penalised, by full-batch L-BFGS from zero: convex,
    so no learning rate or epochs to tune, and the same fit every time (9.5k x 384 features: ~1 s on 2 CPU cores)."""
    with torch.inference_mode(False), torch.enable_grad():
        features, labels = features.float().clone(), labels.clone()  # normal tensors: inference ones take no grad
        mean, std = features.mean(0), features.std(0).clamp_min(1e-6)
        x = (features - mean) / std
        weight = x.new_zeros(num_classes, x.shape[1], requires_grad=True)
        bias = x.new_zeros(num_classes, requires_grad=True)
        optimizer = torch.optim.LBFGS([weight, bias], max_iter=500, history_size=20,
                                      line_search_fn="strong_wolfe", tolerance_grad=1e-7, tolerance_change=1e-10)

        def closure() -> Tensor:
            optimizer.zero_grad()
            loss = F.cross_entropy(x @ weight.T + bias, labels) + weight_decay / 2 * weight.square().sum()
            loss.backward()
            return loss

        optimizer.step(closure)
    return LinearProbe(mean, std, weight.detach(), bias.detach())

