# The v41flash operator image: the package with its pinned dependencies (pyproject.toml) on a slim Python,
# running as an unprivileged user with nothing to write (the chart mounts a read-only root and an emptyDir /tmp).
#   docker build -t v41flash/operator:0.1.0 .
# Python matches the version the project is developed and tested on (3.11).
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml ./
COPY operator ./operator
# A wheel first, then an install into a prefix that the final stage copies whole.
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip install --no-cache-dir --prefix=/install /wheels/*.whl

FROM ${PYTHON_IMAGE}
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
# 65532: the conventional "nonroot" uid; the chart's securityContext runs as it too.
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["v41flash"]
CMD ["operator"]
