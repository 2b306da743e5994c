# the study's commands, as scripts/imagenette_study.py runs them
python train.py -c configs/imagenette_study/v3/mixed.yaml --output output/study/v3/mixed_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v3/mixed_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v3/eval/mixed/mixed_s0
python -m vit_rope.evaluate --checkpoint output/study/v3/mixed_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v3/eval_crop0.875/mixed/mixed_s0
python train.py -c configs/imagenette_study/v3/ape.yaml --output output/study/v3/ape_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v3/ape_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v3/eval/ape/ape_s0
python -m vit_rope.evaluate --checkpoint output/study/v3/ape_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v3/eval_crop0.875/ape/ape_s0
python train.py -c configs/imagenette_study/v3/axial.yaml --output output/study/v3/axial_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/v3/axial_s0/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v3/eval/axial/axial_s0
python -m vit_rope.evaluate --checkpoint output/study/v3/axial_s0/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v3/eval_crop0.875/axial/axial_s0
python -m vit_rope.evaluate --checkpoint output/study/v3/axial_s0/epoch_10.pth output/study/v3/axial_s0/epoch_20.pth --img-sizes 80 112 160 192 256 --limit 1500 --workers 0 --output results/imagenette/v3/course/axial/axial_s0
python train.py -c configs/imagenette_study/v3/mixed.yaml --output output/study/v3/mixed_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v3/mixed_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v3/eval/mixed/mixed_s1
python -m vit_rope.evaluate --checkpoint output/study/v3/mixed_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v3/eval_crop0.875/mixed/mixed_s1
python -m vit_rope.evaluate --checkpoint output/study/v3/mixed_s1/epoch_10.pth output/study/v3/mixed_s1/epoch_20.pth --img-sizes 80 112 160 192 256 --limit 1500 --workers 0 --output results/imagenette/v3/course/mixed/mixed_s1
python train.py -c configs/imagenette_study/v3/ape.yaml --output output/study/v3/ape_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v3/ape_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v3/eval/ape/ape_s1
python -m vit_rope.evaluate --checkpoint output/study/v3/ape_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v3/eval_crop0.875/ape/ape_s1
python -m vit_rope.evaluate --checkpoint output/study/v3/ape_s1/epoch_10.pth output/study/v3/ape_s1/epoch_20.pth --img-sizes 80 112 160 192 256 --limit 1500 --workers 0 --output results/imagenette/v3/course/ape/ape_s1
python train.py -c configs/imagenette_study/v3/axial.yaml --output output/study/v3/axial_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v3/axial_s1/last.pth --img-sizes 80 112 160 192 256 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v3/eval/axial/axial_s1
python -m vit_rope.evaluate --checkpoint output/study/v3/axial_s1/last.pth --img-sizes 80 112 160 192 256 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/v3/eval_crop0.875/axial/axial_s1
python -m vit_rope.evaluate --checkpoint output/study/v3/axial_s1/epoch_10.pth output/study/v3/axial_s1/epoch_20.pth --img-sizes 80 112 160 192 256 --limit 1500 --workers 0 --output results/imagenette/v3/course/axial/axial_s1
