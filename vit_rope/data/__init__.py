"""The data: splits of image folders, shards and datasets, the decoded-image cache, both pipelines and their steps."""
