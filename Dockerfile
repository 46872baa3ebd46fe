# perfdoctor on a PyTorch base image. The base brings torch (perfdoctor never installs it);
# choose the image that matches the training environment you diagnose:
#   docker build --build-arg BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime -t perfdoctor .
#   docker run --rm --gpus all --cap-add SYS_PTRACE -v "$PWD:/work" -w /work perfdoctor run train.py
# (SYS_PTRACE only for `run --stacks`, which attaches py-spy.)
ARG BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime
FROM ${BASE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/perfdoctor
COPY pyproject.toml README.md ./
COPY perfdoctor ./perfdoctor
COPY rules ./rules
RUN python -m pip install --no-cache-dir . \
    && useradd --create-home --uid 1000 doctor \
    && perfdoctor --version

USER 1000
WORKDIR /work
ENTRYPOINT ["perfdoctor"]
CMD ["--help"]
