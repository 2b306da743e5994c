# the study's commands, as scripts/imagenette_study.py runs them
python train.py -c configs/imagenette_study/v4/mixed_coord_sizes.yaml --output output/study/v4/mixed_coord_sizes_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_coord_sizes_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/mixed_coord_sizes/mixed_coord_sizes_s0
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_coord_sizes_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/mixed_coord_sizes/mixed_coord_sizes_s0
python train.py -c configs/imagenette_study/v4/dinov3.yaml --output output/study/v4/dinov3_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v4/dinov3_s0/last.pth --img-sizes 80 112 160 192 256 --policy normalized extrapolate --limit 1500 --workers 0 --output results/imagenette/v4/eval/dinov3/dinov3_s0
python -m vit_rope.evaluate --checkpoint output/study/v4/dinov3_s0/last.pth --img-sizes 80 112 160 192 256 --policy normalized --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/dinov3/dinov3_s0
python train.py -c configs/imagenette_study/v4/ape_sizes.yaml --output output/study/v4/ape_sizes_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_sizes_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/ape_sizes/ape_sizes_s0
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_sizes_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/ape_sizes/ape_sizes_s0
python train.py -c configs/imagenette_study/v4/mixed_coord_sizes.yaml --output output/study/v4/mixed_coord_sizes_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_coord_sizes_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/mixed_coord_sizes/mixed_coord_sizes_s1
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_coord_sizes_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/mixed_coord_sizes/mixed_coord_sizes_s1
python train.py -c configs/imagenette_study/v4/dinov3.yaml --output output/study/v4/dinov3_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v4/dinov3_s1/last.pth --img-sizes 80 112 160 192 256 --policy normalized extrapolate --limit 1500 --workers 0 --output results/imagenette/v4/eval/dinov3/dinov3_s1
python -m vit_rope.evaluate --checkpoint output/study/v4/dinov3_s1/last.pth --img-sizes 80 112 160 192 256 --policy normalized --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/dinov3/dinov3_s1
python train.py -c configs/imagenette_study/v4/ape_sizes.yaml --output output/study/v4/ape_sizes_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_sizes_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/ape_sizes/ape_sizes_s1
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_sizes_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/ape_sizes/ape_sizes_s1
python train.py -c configs/imagenette_study/v4/mixed_third.yaml --output output/study/v4/mixed_third_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_third_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/mixed_third/mixed_third_s0
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_third_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/mixed_third/mixed_third_s0
python train.py -c configs/imagenette_study/v4/ape_third.yaml --output output/study/v4/ape_third_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_third_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/ape_third/ape_third_s0
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_third_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/ape_third/ape_third_s0
python train.py -c configs/imagenette_study/v4/mixed_third.yaml --output output/study/v4/mixed_third_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_third_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/mixed_third/mixed_third_s1
python -m vit_rope.evaluate --checkpoint output/study/v4/mixed_third_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/mixed_third/mixed_third_s1
python train.py -c configs/imagenette_study/v4/ape_third.yaml --output output/study/v4/ape_third_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_third_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v4/eval/ape_third/ape_third_s1
python -m vit_rope.evaluate --checkpoint output/study/v4/ape_third_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v4/eval_crop0.875/ape_third/ape_third_s1
