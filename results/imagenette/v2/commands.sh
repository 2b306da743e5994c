# the study's commands, as scripts/imagenette_study.py runs them
python train.py -c configs/imagenette_study/v2/mixed.yaml --output output/study/v2/mixed_s0 seed=0
python train.py -c configs/imagenette_study/v2/mixed.yaml --output output/study/v2/mixed_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/mixed_s0/last.pth output/study/v2/mixed_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/mixed
python train.py -c configs/imagenette_study/v2/ape.yaml --output output/study/v2/ape_s0 seed=0
python train.py -c configs/imagenette_study/v2/ape.yaml --output output/study/v2/ape_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/ape_s0/last.pth output/study/v2/ape_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/ape
python train.py -c configs/imagenette_study/v2/mixed_coord.yaml --output output/study/v2/mixed_coord_s0 seed=0
python train.py -c configs/imagenette_study/v2/mixed_coord.yaml --output output/study/v2/mixed_coord_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/mixed_coord_s0/last.pth output/study/v2/mixed_coord_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/mixed_coord
python train.py -c configs/imagenette_study/v2/mixed_sizes.yaml --output output/study/v2/mixed_sizes_s0 seed=0
python train.py -c configs/imagenette_study/v2/mixed_sizes.yaml --output output/study/v2/mixed_sizes_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/mixed_sizes_s0/last.pth output/study/v2/mixed_sizes_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/mixed_sizes
python train.py -c configs/imagenette_study/v2/ape_sizes.yaml --output output/study/v2/ape_sizes_s0 seed=0
python train.py -c configs/imagenette_study/v2/ape_sizes.yaml --output output/study/v2/ape_sizes_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/ape_sizes_s0/last.pth output/study/v2/ape_sizes_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/ape_sizes
python train.py -c configs/imagenette_study/v2/mixed_p8.yaml --output output/study/v2/mixed_p8_s0 seed=0
python train.py -c configs/imagenette_study/v2/mixed_p8.yaml --output output/study/v2/mixed_p8_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/mixed_p8_s0/last.pth output/study/v2/mixed_p8_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/mixed_p8
python train.py -c configs/imagenette_study/v2/ape_p8.yaml --output output/study/v2/ape_p8_s0 seed=0
python train.py -c configs/imagenette_study/v2/ape_p8.yaml --output output/study/v2/ape_p8_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/ape_p8_s0/last.pth output/study/v2/ape_p8_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/ape_p8
python train.py -c configs/imagenette_study/v2/axial_p8.yaml --output output/study/v2/axial_p8_s0 seed=0
python train.py -c configs/imagenette_study/v2/axial_p8.yaml --output output/study/v2/axial_p8_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/axial_p8_s0/last.pth output/study/v2/axial_p8_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/axial_p8
python train.py -c configs/imagenette_study/v2/mixed_coord_sizes.yaml --output output/study/v2/mixed_coord_sizes_s0 seed=0
python train.py -c configs/imagenette_study/v2/mixed_coord_sizes.yaml --output output/study/v2/mixed_coord_sizes_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/mixed_coord_sizes_s0/last.pth output/study/v2/mixed_coord_sizes_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/mixed_coord_sizes
python train.py -c configs/imagenette_study/v2/axial.yaml --output output/study/v2/axial_s0 seed=0
python train.py -c configs/imagenette_study/v2/axial.yaml --output output/study/v2/axial_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/axial_s0/last.pth output/study/v2/axial_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/axial
python train.py -c configs/imagenette_study/v2/axial_sizes.yaml --output output/study/v2/axial_sizes_s0 seed=0
python train.py -c configs/imagenette_study/v2/axial_sizes.yaml --output output/study/v2/axial_sizes_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/axial_sizes_s0/last.pth output/study/v2/axial_sizes_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/axial_sizes
python train.py -c configs/imagenette_study/v2/axial_coord.yaml --output output/study/v2/axial_coord_s0 seed=0
python train.py -c configs/imagenette_study/v2/axial_coord.yaml --output output/study/v2/axial_coord_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/v2/axial_coord_s0/last.pth output/study/v2/axial_coord_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/v2/eval/axial_coord
