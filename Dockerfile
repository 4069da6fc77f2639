# One image for every trainmaster process; docker-compose.yml picks the service by its command.
FROM python:3.11-slim
WORKDIR /app
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
COPY pyproject.toml README.md ./
COPY shared shared
COPY services services
RUN pip install '.[s3,aws,gpu]'  # aws: placement's and the minter's EC2 (boto3 was missing from the image)
EXPOSE 8080
CMD ["python", "-m", "services.submitter"]
