# Stand-in for rayproject/ray:<ray>-py311 (the CPU Ray image; workloads/Dockerfile's RAY_IMAGE),
# built by images/build.py on a Debian bookworm minbase root filesystem (mmdebstrap) with Debian's
# python3 (3.11): no registry.
#
# It keeps what workloads/Dockerfile and KubeRay rely on: user `ray` (uid 1000, gid 100) with a
# writable /home/ray; `python`/`pip` of an env owned by that user first on PATH, at the upstream
# path /home/ray/anaconda3 (a venv here, conda upstream), with `ray[default]` installed; the Python
# headers (DeepSpeed compiles an op against them); `bash` and `wget` (KubeRay's exec probes). Like the
# CPU Ray image it has no C++ compiler: workloads/Dockerfile installs g++ with apt, as it does there.
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE}

RUN apt-get update \
    && apt-get install -y --no-install-recommends wget python3-dev \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --uid 1000 --gid 100 --create-home --home-dir /home/ray --shell /bin/bash ray

USER 1000
WORKDIR /home/ray
ENV HOME=/home/ray \
    PATH=/home/ray/anaconda3/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8

# Set by images/build.py: the pinned pip and Ray, and the local wheelhouse (no index) they come from.
ARG PIP_PIN
ARG RAY_PIN
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
RUN /usr/bin/python3 -m venv /home/ray/anaconda3 \
    && pip install --no-cache-dir --disable-pip-version-check "${PIP_PIN}" \
    && pip install --no-cache-dir --disable-pip-version-check "${RAY_PIN}"

CMD ["bash"]
