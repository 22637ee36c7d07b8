# GPU image: tokencredit with the [gpu] extra (vLLM sampling), CUDA from the base image.
FROM nvidia/cuda:12.8.1-runtime-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 \
    PIP_BREAK_SYSTEM_PACKAGES=1
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-pip \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/tokencredit
COPY . .
# The CUDA build of torch 2.13.0 comes from PyTorch's CUDA wheel index, then vLLM on top.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128 \
    && pip install ".[gpu]"

ENTRYPOINT ["tokencredit"]
CMD ["annotate", "--out", "/data/run", "--backend", "vllm", "--device", "cuda"]
