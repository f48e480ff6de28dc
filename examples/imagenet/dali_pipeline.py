"""The DALI pipeline of one rank's shard: decode, crop, resize, flip and normalise images.

Training: a random-resized crop decoded from the crop window and a random flip; validation: the
shorter side resized and a centre crop covering ``val_crop`` of it. ``data.Loader`` builds one
per epoch (and rebuilds it after a bad image), on the CPU or, with a GPU id, decoded with nvJPEG
on that GPU.
"""

# ImageNet channel statistics in 0-255 scale (RGB), as used by torchvision and nnabla-examples.
PIXEL_MEAN = (0.485 * 255, 0.456 * 255, 0.406 * 255)
PIXEL_STD = (0.229 * 255, 0.224 * 255, 0.225 * 255)
# Default share of the shorter side the validation centre crop covers (224 of 256).
VAL_CROP = 0.875
# Largest shorter side validation resizes to (image_size / val_crop), pixels: 18x ImageNet's 224
# crop and 16x its 256 resize; a smaller val_crop asks DALI for ever larger images (1e-9 fails).
MAX_VAL_RESIZE = 4096
DTYPES = {"float": "FLOAT", "half": "FLOAT16"}   # make_loader's dtype -> DALI output type


def build_pipeline(files, labels, batch_size, train, image_size, seed, device_id, num_threads,
                   prefetch, crop_scale, flip, val_crop, dtype):
    """Return the built DALI pipeline over ``files`` and ``labels``, read in the given order."""
    # DALI is imported here so that list tools and tests of the pure-Python parts run without it.
    from nvidia.dali import Pipeline, fn, types

    decoder = "cpu" if device_id is None else "mixed"
    device = "cpu" if device_id is None else "gpu"
    labels_to_gpu = train and device_id is not None           # Loader.labels_on_device
    pipe = Pipeline(batch_size=batch_size, num_threads=num_threads, device_id=device_id,
                    seed=seed, prefetch_queue_depth=prefetch,
                    set_affinity=device_id is not None)     # threads_per_rank
    with pipe:
        # The files are already this rank's shard in this epoch's order: sharding and shuffling
        # are done in shard_plan so that every rank runs the same number of steps and an epoch
        # is an exact, seeded cover of the data.
        jpegs, label = fn.readers.file(files=files, labels=labels, random_shuffle=False,
                                       name="Reader")
        if train:
            # Decoding only the crop window saves most of the decode time on CPU.
            images = fn.decoders.image_random_crop(jpegs, device=decoder,
                                                   output_type=types.RGB,
                                                   random_area=list(crop_scale),
                                                   random_aspect_ratio=[3 / 4, 4 / 3])
            images = fn.resize(images, device=device, resize_x=image_size, resize_y=image_size)
            mirror = fn.random.coin_flip(probability=0.5) if flip else 0
        else:
            images = fn.decoders.image(jpegs, device=decoder, output_type=types.RGB)
            images = fn.resize(images, device=device,
                               resize_shorter=round(image_size / val_crop))
            mirror = 0
        images = fn.crop_mirror_normalize(images, device=device,
                                          dtype=getattr(types, DTYPES[dtype]),
                                          output_layout="CHW", crop=(image_size, image_size),
                                          mean=list(PIXEL_MEAN), std=list(PIXEL_STD),
                                          mirror=mirror)
        # int32 labels of shape (1,) per image: a (batch, 1) int32 device batch, what
        # softmax_cross_entropy reads, copied on the compute stream with the images.
        pipe.set_outputs(images, label.gpu() if labels_to_gpu else label)
    pipe.build()
    return pipe
