# The API (and beat): Mint's core dependencies only, no torch. Stateless; run several replicas.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY mint ./mint
COPY migrations ./migrations
COPY alembic.ini ./
COPY configs ./configs
RUN pip install --no-cache-dir .
ENV MINT_HOME=/var/lib/mint MINT_API_HOST=0.0.0.0
EXPOSE 8000
CMD ["mint", "api"]
