# The scale-out queue of one region (optional; the cells' embedded queue
# is the default): an MSK cluster over the region's private subnets.

terraform {
  required_providers {
    aws = { source = "hashicorp/aws", version = ">= 5.0" }
  }
}

resource "aws_msk_cluster" "this" {
  count                  = var.enabled ? 1 : 0
  cluster_name           = "${var.deployment}-${var.region}"
  kafka_version          = var.kafka_version
  number_of_broker_nodes = var.brokers
  broker_node_group_info {
    instance_type   = var.instance_type
    client_subnets  = var.subnet_ids
    security_groups = var.security_group_ids
    storage_info {
      ebs_storage_info {
        volume_size = var.volume_gib
      }
    }
  }
  encryption_info {
    encryption_in_transit {
      client_broker = "TLS_PLAINTEXT"
    }
  }
}
