"""The data: ImageFolder splits with clear errors, the decoded-image cache, the batched tensor pipeline and its ops,
the size of each step under the token budget, and the step sampler both pipelines share."""
