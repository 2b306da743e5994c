# the study's commands, as scripts/imagenette_study.py runs them
python train.py -c configs/imagenette_study/ape.yaml --output output/study/ape_s0 seed=0
python train.py -c configs/imagenette_study/ape.yaml --output output/study/ape_s1 seed=1
python train.py -c configs/imagenette_study/axial.yaml --output output/study/axial_s0 seed=0
python train.py -c configs/imagenette_study/axial.yaml --output output/study/axial_s1 seed=1
python train.py -c configs/imagenette_study/mixed.yaml --output output/study/mixed_s0 seed=0
python train.py -c configs/imagenette_study/mixed.yaml --output output/study/mixed_s1 seed=1
python train.py -c configs/imagenette_study/axial_ape.yaml --output output/study/axial_ape_s0 seed=0
python train.py -c configs/imagenette_study/axial_ape.yaml --output output/study/axial_ape_s1 seed=1
python train.py -c configs/imagenette_study/mixed_ape.yaml --output output/study/mixed_ape_s0 seed=0
python train.py -c configs/imagenette_study/mixed_ape.yaml --output output/study/mixed_ape_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/ape_s0/last.pth output/study/ape_s1/last.pth output/study/axial_s0/last.pth output/study/axial_s1/last.pth output/study/mixed_s0/last.pth output/study/mixed_s1/last.pth output/study/axial_ape_s0/last.pth output/study/axial_ape_s1/last.pth output/study/mixed_ape_s0/last.pth output/study/mixed_ape_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/eval
