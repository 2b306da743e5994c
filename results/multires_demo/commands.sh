# The variable-resolution measurement: the demo recipe with and without train_sizes (one seed each), 2-core CPU, no GPU.
make demo                                   # output/demo (copied here as output/demo_single), one size: 64 px
python train.py -c configs/imagenette_cpu_multires.yaml --output output/multires log_interval=0   # 48-96 px
python -m vit_rope.evaluate --checkpoint output/demo_single/best.pth output/multires/best.pth \
    --img-sizes 48 64 80 96 128 160 --limit 1500 --workers 1 \
    --policy extrapolate interpolate ntk yarn normalized --output results/multires_demo/eval
