"""Reference copy of LookHere's official model code, for the parity test (tests/models/test_lookhere_parity.py).

From github.com/GreenCUBIC/lookhere (commit 641deab8c6610b6480a5c564a9a34a29bf934574), files lookhere.py and vision_transformer.py, under the MIT
license below. Changes, none to the maths: the two files joined; scipy's pdist / squareform / cdist replaced by the
same Euclidean distances in numpy (scipy is not a dependency here); the unused einops import dropped; what the
tests never run left out: the plain ``Attention.forward`` and ``VisionTransformer.forward_features`` (LookHere
overrides both), ``no_weight_decay``, tuple image sizes, ``set_pos_embed``'s new global slope, the slopes and
layouts of head counts no test builds (6, 16 heads), the direction sets no test builds (zero, noneNzeroM, zerocorners,
zerotriangles), and the prints of unknown distances and fills. The code is otherwise as published.

MIT License

Copyright (c) 2024 cuBIC

Permission is hereby granted, free of charge, to any person obtaining a copy of this software and associated
documentation files (the "Software"), to deal in the Software without restriction, including without limitation the
rights to use, copy, modify, merge, publish, distribute, sublicense, and/or sell copies of the Software, and to permit
persons to whom the Software is furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all copies or substantial portions of the
Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR IMPLIED, INCLUDING BUT NOT LIMITED TO THE
WARRANTIES OF MERCHANTABILITY, FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE AUTHORS OR
COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR
OTHERWISE, ARISING FROM, OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE SOFTWARE.
"""
# ruff: noqa
import torch
import torch.nn as nn
import torch.nn.functional as F
from timm.layers import PatchEmbed, Mlp, DropPath, trunc_normal_


class Attention(nn.Module):
    def __init__(
        self,
        dim,
        num_heads=12,
        qkv_bias=True,
    ):
        super().__init__()
        assert dim % num_heads == 0, "dim should be divisible by num_heads"
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.use_scaled_dot = True

        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)


class LayerScale(nn.Module):
    def __init__(self, dim, init_values=1e-4, inplace=False):
        super().__init__()
        self.inplace = inplace
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        return x.mul_(self.gamma) if self.inplace else x * self.gamma


class Block(nn.Module):
    def __init__(
        self,
        dim,
        num_heads,
        mlp_ratio=4.0,
        init_values=1e-4,
        drop_path=0.1,
        mlp_dropout=0.0,
    ):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(
            dim,
            num_heads=num_heads,
        )
        self.ls1 = LayerScale(dim, init_values=init_values)
        self.drop_path1 = DropPath(drop_path)

        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(
            in_features=dim,
            hidden_features=int(dim * mlp_ratio),
            act_layer=nn.GELU,
            drop=mlp_dropout,
        )
        self.ls2 = LayerScale(dim, init_values=init_values)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x):
        x = x + self.drop_path1(self.ls1(self.attn(self.norm1(x))))
        x = x + self.drop_path2(self.ls2(self.mlp(self.norm2(x))))
        return x


class VisionTransformer(nn.Module):
    """Vision Transformer with LayerScale (https://arxiv.org/abs/2103.17239) support
    taken from https://github.com/rwightman/pytorch-image-models/blob/master/timm/models/vision_transformer.py
    with slight modifications
    """

    def __init__(
        self,
        img_size=224,
        patch_size=16,
        in_chans=3,
        num_classes=1000,
        embed_dim=768,
        depth=12,
        num_heads=12,
        mlp_ratio=4.0,
        block_fn=Block,
        drop_path_rate=0.1,
        mlp_dropout=0.0,
        init_values=1e-4,
    ):
        super().__init__()

        self.num_classes = num_classes
        self.num_features = self.embed_dim = embed_dim
        self.drop_path_rate = drop_path_rate
        self.mlp_dropout = mlp_dropout
        self.mlp_ratio = mlp_ratio
        self.num_heads = num_heads
        self.depth = depth
        self.init_values = init_values

        if type(img_size) is int:
            assert img_size % patch_size == 0, "img size be divisible by patch size"
            self.grid_size = (img_size // patch_size, img_size // patch_size)

        self.patch_embed = PatchEmbed(
            img_size=None, patch_size=patch_size, in_chans=in_chans, embed_dim=embed_dim
        )

        num_patches = self.grid_size[0] * self.grid_size[1]
        self.pos_embed = nn.Parameter(torch.zeros(1, num_patches, self.embed_dim))
        self.cls_token = nn.Parameter(torch.zeros(1, 1, self.embed_dim))

        dpr = [drop_path_rate for i in range(depth)]
        self.blocks = nn.Sequential(
            *[
                block_fn(
                    dim=embed_dim,
                    num_heads=num_heads,
                    mlp_ratio=mlp_ratio,
                    init_values=init_values,
                    drop_path=dpr[i],
                    mlp_dropout=mlp_dropout,
                )
                for i in range(depth)
            ]
        )

        self.norm = nn.LayerNorm(embed_dim)
        self.head = Mlp(
            in_features=embed_dim,
            hidden_features=int(embed_dim * mlp_ratio),
            out_features=num_classes,
            act_layer=torch.nn.Tanh,
        )
        trunc_normal_(self.pos_embed, std=0.02)
        trunc_normal_(self.cls_token, std=0.02)
        self.apply(self._init_weights)

        # thanks Lucas Beyer on Twitter
        torch.nn.init.constant_(self.head.fc2.weight, 0)  # Set weights to 0
        torch.nn.init.constant_(self.head.fc2.bias, -6.9)  # Set biases to -6.9

    def _init_weights(self, m):
        if isinstance(m, nn.Linear):
            trunc_normal_(m.weight, std=0.02)
            if isinstance(m, nn.Linear) and m.bias is not None:
                nn.init.constant_(m.bias, 0)
        elif isinstance(m, nn.LayerNorm):
            nn.init.constant_(m.bias, 0)
            nn.init.constant_(m.weight, 1.0)
    
    def turn_off_scaled_dot(self):
        for block in self.blocks:
            block.attn.use_scaled_dot = False

    def forward_head(self, x):
        return self.head(x[:, 0])

    def forward(self, x):
        x = self.forward_features(x)
        x = self.forward_head(x)
        return x
import numpy as np
from itertools import groupby


class AttentionWithBiases(Attention):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)

    def set_bias_map(self, bias_map):
        self.bias_map = bias_map

    def forward(self, x):
        B, N, C = x.shape
        qkv = (
            self.qkv(x)
            .reshape(B, N, 3, self.num_heads, self.head_dim)
            .permute(2, 0, 3, 1, 4)
        )
        q, k, v = qkv.unbind(0)

        if self.use_scaled_dot:
            x = F.scaled_dot_product_attention(q, k, v, attn_mask=self.bias_map)
        else:
            q = q * self.scale
            attn = q @ k.transpose(-2, -1) + self.bias_map
            attn = attn.softmax(dim=-1)
            x = attn @ v

        x = x.transpose(1, 2).reshape(B, N, C)
        x = self.proj(x)
        return x


class BlockwithBiases(Block):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.attn = AttentionWithBiases(
            dim=kwargs["dim"],
            num_heads=kwargs["num_heads"],
        )


class LookHere(VisionTransformer):
    def __init__(self, device, lh_config, **kwargs):
        kwargs["block_fn"] = BlockwithBiases

        super().__init__(**kwargs)
        del self.pos_embed  # don't need them
        self.device = device
        self.lh_config = lh_config
        self.set_pos_embed(self.grid_size)
        self.to(self.device)

    def set_pos_embed(self, grid_size):
        if type(grid_size) is int:
            grid_size = (grid_size, grid_size)

        num_patch = int(grid_size[0] * grid_size[1])
        bias_maps = create_lh_bias_tensor(
            self.lh_config, grid_size, self.depth, self.num_heads
        ).to(
            self.device
        )  # (depth, num_heads, grid_size^2, grid_size^2)
        zeros_1 = torch.zeros(
            size=(self.depth, self.num_heads, num_patch, 1),
            dtype=torch.float,
            device=self.device,
        )  # (depth, num_heads, grid_size^2, 1)
        bias_maps = torch.cat(
            [zeros_1, bias_maps], dim=-1
        )  # (depth, num_heads, grid_size^2, grid_size^2+1)
        zeros_2 = torch.zeros(
            size=(self.depth, self.num_heads, 1, (num_patch + 1)),
            dtype=torch.float,
            device=self.device,
        )  # (depth, num_heads, 1, grid_size^2+1)
        bias_maps = torch.cat(
            [zeros_2, bias_maps], dim=-2
        )  # (depth, num_heads, grid_size^2+1, grid_size^2+1)

        for i, block in enumerate(self.blocks):
            block.attn.set_bias_map(bias_maps[i])

        self.to(self.device)

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.blocks(x)
        x = self.norm(x)
        return x


# Create LH masks and biases
# This is a bit hard to read but it allows us to create many LH configs, most of which we evaluate in our appendix

def get_none_slopes(n):
    slopes = [0.25, 0.0625, 0.015625, 0.00390625]
    return slopes


def get_slopes(n):
    return np.repeat(np.exp2(-np.arange(1, n / 4 + 1)), 4)


def create_lh_bias_tensor(lh_config, grid_size, depth, num_heads):
    global_slope = lh_config["global_slope"]
    layer_slopes = np.linspace(
        lh_config["layer_slopes"][0], lh_config["layer_slopes"][1], depth
    )
    head_directions = lh_config["head_directions"]

    if "distance" not in lh_config.keys():
        distance = "linear"
    else:
        distance = lh_config["distance"]

    if "fill_with" not in lh_config.keys():
        fill_with = "inf"
    else:
        fill_with = lh_config["fill_with"]

    if type(head_directions) is list:
        lh = []
        for direction in head_directions:
            lh.append(
                create_lh_layer_tensor(
                    grid_size, direction, num_heads, distance, fill_with
                )
            )
        lh = np.stack(lh, axis=0)
    else:
        lh = create_lh_layer_tensor(
            grid_size, head_directions, num_heads, distance, fill_with
        )

    # replace inf with max
    layer_slopes = np.expand_dims(layer_slopes, (1, 2, 3))
    lh = global_slope * layer_slopes * lh
    lh = np.nan_to_num(lh, posinf=torch.finfo(torch.bfloat16).max)
    lh = torch.tensor(lh, dtype=torch.bfloat16) * -1.0

    return lh


def create_lh_layer_tensor(grid_size, direction, num_heads, distance, fill_with):
    dir_short_hand = {
        "none": [[]] * 4,
        "center": [["center"]] * 4,
        "halves": [["up"], ["down"], ["left"], ["right"]],
        "corners": [
            ["up", "left"],
            ["up", "right"],
            ["down", "left"],
            ["down", "right"],
        ],
        "triangles": [["tri_up"], ["tri_down"], ["tri_left"], ["tri_right"]],
        "diagonals": [
            ["diag_up_right"],
            ["diag_up_left"],
            ["diag_down_right"],
            ["diag_down_left"],
        ],
        "eighths1": [
            ["tri_up", "left"],
            ["tri_down", "left"],
            ["tri_left", "up"],
            ["tri_right", "up"],
        ],
        "eighths2": [
            ["tri_up", "right"],
            ["tri_down", "right"],
            ["tri_left", "down"],
            ["tri_right", "down"],
        ],
        "zerohalves": [
            ["zero", "up"],
            ["zero", "down"],
            ["zero", "left"],
            ["zero", "right"],
        ],
    }

    # get configs
    sh = direction.split("-")
    dirs = [dir_short_hand[s] for s in sh]

    # number of options
    if len(sh) == 1:
        head_names = [sh[0]] * num_heads
        head_directions = dirs[0] * (num_heads // 4)
    elif len(sh) == 2 and num_heads == 12:
        head_names = [sh[0]] * 8 + [sh[1]] * 4
        head_directions = dirs[0] * 2 + dirs[1]
    elif len(sh) == 3 and num_heads == 12:
        head_names = [sh[0]] * 4 + [sh[1]] * 4 + [sh[2]] * 4
        head_directions = dirs[0] + dirs[1] + dirs[2]

    # calculate slopes
    head_slopes = []
    for k, v in groupby(head_names):
        if ("zero" in k) or ("center" in k) or ("none" in k):
            head_slopes.append(get_none_slopes(len(list(v))))
        elif (
            ("halves" in k)
            or ("corners" in k)
            or ("triangles" in k)
            or ("eighths1" in k)
            or ("eighths2" in k)
            or ("diagonals" in k)
        ):
            head_slopes.append(get_slopes(len(list(v))))
    head_slopes = np.concatenate(head_slopes)

    # create list of grid coordinates
    grid_y, grid_x = grid_size
    num_patch = grid_x * grid_y
    grid_locs = np.meshgrid(range(grid_x), range(grid_y))
    coords = np.stack(grid_locs, axis=-1).reshape((-1, 2))

    # bias map for center direction
    center_location = np.array([(grid_x - 1) / 2, (grid_y - 1) / 2], ndmin=2)
    center_map = np.repeat(
        np.linalg.norm(center_location[:, None, :] - coords[None, :, :], axis=-1), num_patch, axis=0
    )
    zero_map = np.zeros_like(
        center_map
    )  # map of zeros means no positional information whatsoever

    # create mask for direction types
    if (
        ("halves" in head_names)
        or ("corners" in head_names)
        or ("eighths1" in head_names)
        or ("eighths2" in head_names)
        or ("zerohalves" in head_names)
    ):
        compare_x = np.expand_dims(np.arange(grid_x), (1, 2))
        compare_y = np.expand_dims(np.arange(grid_y), (1, 2))
        direction_mask = {  # means the direction we are looking
            "right": np.less(grid_locs[0], compare_x)[coords[:, 0]],
            "left": np.greater(grid_locs[0], compare_x)[coords[:, 0]],
            "up": np.greater(grid_locs[1], compare_y)[coords[:, 1]],
            "down": np.less(grid_locs[1], compare_y)[coords[:, 1]],
        }

    # for triangles
    if (
        ("triangles" in head_names)
        or ("eighths1" in head_names)
        or ("eighths2" in head_names)
        or ("diagonals" in head_names)
    ):
        # get the k for each coordinate (k = 0 is the main diagonal, while k < 0 is below it, and k > 0 is above)
        diag_coord_ud = []
        diag_label_ud = []
        diag_coord_lr = []
        diag_label_lr = []
        max_dia = np.max((grid_x, grid_y))
        for i in range(-max_dia + 1, max_dia):
            d = np.vstack([np.diag(grid_locs[0], i), np.diag(grid_locs[1], i)])
            diag_label_ud.append(i * np.ones(d.shape[1]))
            diag_coord_ud.append(d)
            d = np.vstack(
                [
                    np.diag(np.fliplr(grid_locs[0]), i),
                    np.diag(np.fliplr(grid_locs[1]), i),
                ]
            )
            diag_label_lr.append(i * np.ones(d.shape[1]))
            diag_coord_lr.append(d)

        diag_coord_ud = np.concatenate(diag_coord_ud, axis=1).T
        diag_label_ud = np.concatenate(diag_label_ud).T
        diag_coord_lr = np.concatenate(diag_coord_lr, axis=1).T
        diag_label_lr = np.concatenate(diag_label_lr).T

        # for each coordinate determine the associated triangle in each direction
        triangles = {
            dir: np.ones((num_patch, num_patch), dtype=bool)
            for dir in ["up", "down", "left", "right"]
        }
        for i in range(coords.shape[0]):
            diag_pos = diag_label_ud[
                np.all(coords[[i], :] == diag_coord_ud[:, :2], axis=1)
            ]  # positive diagonal
            diag_neg = diag_label_lr[
                np.all(coords[[i], :] == diag_coord_lr[:, :2], axis=1)
            ]  # negative diagonal
            trid = np.tri(grid_y, grid_x, k=diag_pos[0], dtype=bool)
            triu = ~np.tri(grid_y, grid_x, k=diag_pos[0] - 1, dtype=bool)
            trir = np.fliplr(np.tri(grid_y, grid_x, k=diag_neg[0], dtype=bool))
            tril = ~np.fliplr(np.tri(grid_y, grid_x, k=diag_neg[0] - 1, dtype=bool))
            triangles["up"][i, :] = ~(triu & tril).flatten()
            triangles["down"][i, :] = ~(trid & trir).flatten()
            triangles["right"][i, :] = ~(triu & trir).flatten()
            triangles["left"][i, :] = ~(trid & tril).flatten()

    # calculate dist matrix
    m = np.linalg.norm(coords[:, None, :] - coords[None, :, :], axis=-1)
    lh = np.tile(m, (num_heads, 1, 1))
    if distance == "sqrt":
        lh = lh**0.5
    elif distance == "square":
        lh = lh**2
    elif distance == "linear":
        pass

    # apply directions
    for h in range(num_heads):
        dir_mask = np.zeros_like(m, dtype=bool)
        for dir in head_directions[h]:
            if dir == "center":
                lh[h, :] = center_map
            elif dir == "zero":
                lh[h, :] = zero_map
            elif "tri" in dir:
                tri_type = dir.split("_")[1]
                dir_mask = dir_mask | triangles[tri_type]
            elif "diag" in dir:
                tri_type_1 = dir.split("_")[1]
                tri_type_2 = dir.split("_")[2]
                first_mask = triangles[tri_type_1] & triangles[tri_type_2]
                dir_mask = dir_mask | first_mask
            else:
                dir_mask = dir_mask | direction_mask[dir].reshape((num_patch, -1))

            if fill_with == "inf":
                lh[h, dir_mask] = np.inf
            elif fill_with == "zero":
                lh[h, dir_mask] = 0
            elif fill_with == "max":
                lh[h, dir_mask] = lh[h, :].max()

    # apply slopes to lh
    head_slopes = np.expand_dims(head_slopes, (1, 2))
    lh = head_slopes * lh

    return lh
