# Stand-in for python:3.11-slim (operator/Dockerfile's PYTHON_IMAGE), built by images/build.py on a
# Debian bookworm minbase root filesystem (mmdebstrap) with Debian's python3 (3.11): no registry.
#
# It keeps what operator/Dockerfile relies on: `python`, `python3` and `pip` of Python 3.11 first on
# PATH (a venv, so pip installs beside Debian's python3 without touching it), groupadd/useradd
# (Debian's passwd package), CA certificates and root as the default user.
ARG DEBIAN_IMAGE
FROM ${DEBIAN_IMAGE}

# Set by images/build.py: the pinned pip and the local wheelhouse (no index) it is installed from.
ARG PIP_PIN
ARG PIP_FIND_LINKS
ARG PIP_NO_INDEX
RUN /usr/bin/python3 -m venv /opt/python \
    && /opt/python/bin/pip install --no-cache-dir --disable-pip-version-check "${PIP_PIN}"

ENV PATH=/opt/python/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8
CMD ["python3"]
