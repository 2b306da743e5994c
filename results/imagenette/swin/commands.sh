# the study's commands, as scripts/imagenette_study.py runs them
python train.py -c configs/imagenette_study/swin/mixed.yaml --output output/study/swin/mixed_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/swin/mixed_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --window-size scale --limit 1500 --workers 0 --output results/imagenette/swin/eval/mixed/mixed_s0
python -m vit_rope.evaluate --checkpoint output/study/swin/mixed_s0/last.pth --img-sizes 48 64 80 96 128 160 --window-size keep --pad-windows --limit 1500 --workers 0 --output results/imagenette/swin/eval_windows_keep/mixed/mixed_s0
python train.py -c configs/imagenette_study/swin/axial.yaml --output output/study/swin/axial_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/swin/axial_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --window-size scale --limit 1500 --workers 0 --output results/imagenette/swin/eval/axial/axial_s0
python -m vit_rope.evaluate --checkpoint output/study/swin/axial_s0/last.pth --img-sizes 48 64 80 96 128 160 --window-size keep --pad-windows --limit 1500 --workers 0 --output results/imagenette/swin/eval_windows_keep/axial/axial_s0
python train.py -c configs/imagenette_study/swin/rpb.yaml --output output/study/swin/rpb_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/swin/rpb_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --window-size scale --limit 1500 --workers 0 --output results/imagenette/swin/eval/rpb/rpb_s0
python -m vit_rope.evaluate --checkpoint output/study/swin/rpb_s0/last.pth --img-sizes 48 64 80 96 128 160 --window-size keep --pad-windows --limit 1500 --workers 0 --output results/imagenette/swin/eval_windows_keep/rpb/rpb_s0
python train.py -c configs/imagenette_study/swin/mixed.yaml --output output/study/swin/mixed_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/swin/mixed_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --window-size scale --limit 1500 --workers 0 --output results/imagenette/swin/eval/mixed/mixed_s1
python -m vit_rope.evaluate --checkpoint output/study/swin/mixed_s1/last.pth --img-sizes 48 64 80 96 128 160 --window-size keep --pad-windows --limit 1500 --workers 0 --output results/imagenette/swin/eval_windows_keep/mixed/mixed_s1
python train.py -c configs/imagenette_study/swin/axial.yaml --output output/study/swin/axial_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/swin/axial_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --window-size scale --limit 1500 --workers 0 --output results/imagenette/swin/eval/axial/axial_s1
python -m vit_rope.evaluate --checkpoint output/study/swin/axial_s1/last.pth --img-sizes 48 64 80 96 128 160 --window-size keep --pad-windows --limit 1500 --workers 0 --output results/imagenette/swin/eval_windows_keep/axial/axial_s1
python train.py -c configs/imagenette_study/swin/rpb.yaml --output output/study/swin/rpb_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/swin/rpb_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --window-size scale --limit 1500 --workers 0 --output results/imagenette/swin/eval/rpb/rpb_s1
python -m vit_rope.evaluate --checkpoint output/study/swin/rpb_s1/last.pth --img-sizes 48 64 80 96 128 160 --window-size keep --pad-windows --limit 1500 --workers 0 --output results/imagenette/swin/eval_windows_keep/rpb/rpb_s1
