# the study's commands, as scripts/imagenette_study.py runs them
python train.py -c configs/imagenette_study/encodings/mixed_p8.yaml --output output/study/encodings/mixed_p8_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/mixed_p8_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/mixed_p8/mixed_p8_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/mixed_p8_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/mixed_p8/mixed_p8_s0
python train.py -c configs/imagenette_study/encodings/axial_p8.yaml --output output/study/encodings/axial_p8_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/axial_p8_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/axial_p8/axial_p8_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/axial_p8_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/axial_p8/axial_p8_s0
python train.py -c configs/imagenette_study/encodings/ape_p8.yaml --output output/study/encodings/ape_p8_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/ape_p8_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/ape_p8/ape_p8_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/ape_p8_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/ape_p8/ape_p8_s0
python train.py -c configs/imagenette_study/encodings/golden.yaml --output output/study/encodings/golden_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/golden_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/golden/golden_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/golden_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/golden/golden_s0
python train.py -c configs/imagenette_study/encodings/string_mixed.yaml --output output/study/encodings/string_mixed_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/string_mixed_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/string_mixed/string_mixed_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/string_mixed_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/string_mixed/string_mixed_s0
python train.py -c configs/imagenette_study/encodings/lookhere.yaml --output output/study/encodings/lookhere_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/lookhere_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/lookhere/lookhere_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/lookhere_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/lookhere/lookhere_s0
python train.py -c configs/imagenette_study/encodings/alibi.yaml --output output/study/encodings/alibi_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/alibi_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/alibi/alibi_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/alibi_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/alibi/alibi_s0
python train.py -c configs/imagenette_study/encodings/nope.yaml --output output/study/encodings/nope_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/nope_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/nope/nope_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/nope_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/nope/nope_s0
python train.py -c configs/imagenette_study/encodings/golden.yaml --output output/study/encodings/golden_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/golden_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/golden/golden_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/golden_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/golden/golden_s1
python train.py -c configs/imagenette_study/encodings/alibi.yaml --output output/study/encodings/alibi_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/alibi_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/alibi/alibi_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/alibi_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/alibi/alibi_s1
python train.py -c configs/imagenette_study/encodings/nope.yaml --output output/study/encodings/nope_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/nope_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/nope/nope_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/nope_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/nope/nope_s1
python train.py -c configs/imagenette_study/encodings/string_mixed.yaml --output output/study/encodings/string_mixed_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/string_mixed_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate ntk yarn normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/string_mixed/string_mixed_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/string_mixed_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/string_mixed/string_mixed_s1
python train.py -c configs/imagenette_study/encodings/lookhere.yaml --output output/study/encodings/lookhere_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/lookhere_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/lookhere/lookhere_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/lookhere_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/lookhere/lookhere_s1
python train.py -c configs/imagenette_study/encodings/pape.yaml --output output/study/encodings/pape_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/pape/pape_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/pape/pape_s0
python train.py -c configs/imagenette_study/encodings/comrope_ld.yaml --output output/study/encodings/comrope_ld_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ld_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/comrope_ld/comrope_ld_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ld_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/comrope_ld/comrope_ld_s0
python train.py -c configs/imagenette_study/encodings/liere.yaml --output output/study/encodings/liere_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/liere_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/liere/liere_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/liere_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/liere/liere_s0
python train.py -c configs/imagenette_study/encodings/pape_ri.yaml --output output/study/encodings/pape_ri_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_ri_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/pape_ri/pape_ri_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_ri_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/pape_ri/pape_ri_s0
python train.py -c configs/imagenette_study/encodings/comrope_ap.yaml --output output/study/encodings/comrope_ap_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ap_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/comrope_ap/comrope_ap_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ap_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/comrope_ap/comrope_ap_s0
python train.py -c configs/imagenette_study/encodings/pape.yaml --output output/study/encodings/pape_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/pape/pape_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/pape/pape_s1
python train.py -c configs/imagenette_study/encodings/comrope_ld.yaml --output output/study/encodings/comrope_ld_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ld_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/comrope_ld/comrope_ld_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ld_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/comrope_ld/comrope_ld_s1
python train.py -c configs/imagenette_study/encodings/liere.yaml --output output/study/encodings/liere_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/liere_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/liere/liere_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/liere_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/liere/liere_s1
python train.py -c configs/imagenette_study/encodings/pape_ri.yaml --output output/study/encodings/pape_ri_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_ri_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate normalized --limit 1500 --workers 0 --output results/imagenette/encodings/eval/pape_ri/pape_ri_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/pape_ri_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/pape_ri/pape_ri_s1
python train.py -c configs/imagenette_study/encodings/comrope_ap.yaml --output output/study/encodings/comrope_ap_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ap_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/comrope_ap/comrope_ap_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/comrope_ap_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/comrope_ap/comrope_ap_s1
python train.py -c configs/imagenette_study/encodings/fire.yaml --output output/study/encodings/fire_s0 seed=0
python -m vit_rope.evaluate --checkpoint output/study/encodings/fire_s0/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/fire/fire_s0
python -m vit_rope.evaluate --checkpoint output/study/encodings/fire_s0/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/fire/fire_s0
python train.py -c configs/imagenette_study/encodings/fire.yaml --output output/study/encodings/fire_s1 seed=1
python -m vit_rope.evaluate --checkpoint output/study/encodings/fire_s1/last.pth --img-sizes 48 64 80 96 128 160 --policy extrapolate interpolate --limit 1500 --workers 0 --output results/imagenette/encodings/eval/fire/fire_s1
python -m vit_rope.evaluate --checkpoint output/study/encodings/fire_s1/last.pth --img-sizes 48 64 80 96 128 160 --crop-pct 0.875 --limit 1500 --workers 0 --output results/imagenette/encodings/eval_crop0.875/fire/fire_s1
