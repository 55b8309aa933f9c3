# One cellmesh process on one instance: an instance profile (allowed to
# read this process's certificate bundle only, see tls.tf), the instance
# with cloud-init that installs the binary and the config rendered for it,
# a gp3 data volume (RocksDB, etcd), and a stable private DNS name.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

data "aws_ami" "debian" {
  count       = var.ami_id == "" ? 1 : 0
  most_recent = true
  owners      = ["136693071363"]
  filter {
    name   = "name"
    values = ["debian-12-amd64-*"]
  }
}

resource "aws_iam_role" "this" {
  name = "${var.name}-role"
  assume_role_policy = jsonencode({
    Version = "2012-10-17"
    Statement = [{
      Effect    = "Allow"
      Principal = { Service = "ec2.amazonaws.com" }
      Action    = "sts:AssumeRole"
    }]
  })
}

resource "aws_iam_instance_profile" "this" {
  name = "${var.name}-profile"
  role = aws_iam_role.this.name
}

resource "aws_instance" "this" {
  ami                    = var.ami_id != "" ? var.ami_id : data.aws_ami.debian[0].id
  instance_type          = var.instance_type
  subnet_id              = var.subnet_id
  vpc_security_group_ids = var.security_group_ids
  iam_instance_profile   = aws_iam_instance_profile.this.name
  ebs_optimized          = true
  monitoring             = true
  user_data = templatefile("${path.module}/../cloud-init.sh.tftpl", {
    role         = var.role
    config       = var.config
    cellmesh_url = var.cellmesh_url
    data_device  = var.data_volume_gib > 0 ? "/dev/nvme1n1" : ""
    tls_secret   = var.tls == null ? "" : aws_secretsmanager_secret.tls[0].arn
    aws_region   = data.aws_region.current.name
  })
  user_data_replace_on_change = true
  root_block_device {
    volume_type = "gp3"
    volume_size = 20
    encrypted   = true
  }
  metadata_options {
    http_tokens = "required"
  }
  tags = { Name = var.name, "cellmesh:role" = var.role }
  # The bundle and the right to read it exist before the first boot.
  depends_on = [aws_secretsmanager_secret_version.tls, aws_iam_role_policy.tls]
}

resource "aws_ebs_volume" "data" {
  count             = var.data_volume_gib > 0 ? 1 : 0
  availability_zone = aws_instance.this.availability_zone
  size              = var.data_volume_gib
  type              = "gp3"
  iops              = var.data_volume_iops
  encrypted         = true
  tags              = { Name = "${var.name}-data" }
}

resource "aws_volume_attachment" "data" {
  count       = var.data_volume_gib > 0 ? 1 : 0
  device_name = "/dev/sdf"
  volume_id   = aws_ebs_volume.data[0].id
  instance_id = aws_instance.this.id
}

resource "aws_route53_record" "this" {
  zone_id = var.zone_id
  name    = var.host
  type    = "A"
  ttl     = 30
  records = [aws_instance.this.private_ip]
}
