variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "name" {
  description = "The cell's name in its region (c1, c2, ...)."
  type        = string
  validation {
    condition     = can(regex("^[a-z0-9][a-z0-9-]{0,30}$", var.name))
    error_message = "a cell name is 1 to 31 lowercase letters, digits or dashes."
  }
}

variable "instance_id" {
  description = "Unique per cell in the deployment (message ids), 0 to 1023."
  type        = number
  validation {
    condition     = var.instance_id >= 0 && var.instance_id <= 1023
    error_message = "instance_id must be between 0 and 1023."
  }
}

variable "port" {
  type    = number
  default = 7400
}

variable "routers" {
  description = "Routing API endpoints (http://host:port)."
  type        = list(string)
}

variable "etcd_endpoints" {
  type    = list(string)
  default = []
}

variable "tls" {
  description = "The certificate bundles: the folder `cellmesh pki issue-all` wrote, the KMS key secrets are encrypted with, and the recovery window of a deleted secret (days; 0: none)."
  type = object({
    dir           = string
    kms_key_arn   = string
    recovery_days = optional(number, 7)
  })
}

variable "kafka_brokers" {
  description = "Bootstrap brokers; empty for the embedded queue."
  type        = string
  default     = ""
}

variable "kafka_partitions" {
  type    = number
  default = 4
}

variable "zone_id" {
  type = string
}

variable "zone_name" {
  type = string
}

variable "instance_type" {
  type    = string
  default = "m6i.large"
}

variable "ami_id" {
  type    = string
  default = ""
}

variable "subnet_id" {
  type = string
}

variable "security_group_ids" {
  type = list(string)
}

variable "data_volume_gib" {
  type    = number
  default = 100
}

variable "cellmesh_url" {
  type = string
}

variable "telemetry" {
  description = "Metrics port, OTLP endpoint and sample ratio (see ../config)."
  type        = any
  default     = {}
}
