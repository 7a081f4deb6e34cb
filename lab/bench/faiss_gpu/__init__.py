"""faiss-gpu on the lent GPU machine (CUDA 13 image, 64 MiB carry): shims and the fat-binary pruner."""
