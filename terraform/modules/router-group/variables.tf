variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "members" {
  description = "Every replica of the group: node id, region, private DNS name."
  type        = list(object({ node_id = number, region = string, host = string }))
  validation {
    condition     = length(var.members) >= 3 && length(var.members) % 2 == 1
    error_message = "the router group needs an odd number of replicas, at least 3 (a majority must survive a region)."
  }
  validation {
    condition     = length(distinct([for m in var.members : m.node_id])) == length(var.members) && alltrue([for m in var.members : m.node_id > 0])
    error_message = "router node ids must be unique and non-zero."
  }
}

variable "api_port" {
  type    = number
  default = 7300
}

variable "raft_port" {
  type    = number
  default = 7301
}

variable "tls" {
  description = "The certificate bundles: the folder `cellmesh pki issue-all` wrote, the KMS key secrets are encrypted with, and the recovery window of a deleted secret (days; 0: none)."
  type = object({
    dir           = string
    kms_key_arn   = string
    recovery_days = optional(number, 7)
  })
}

variable "zone_id" {
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

variable "subnet_ids" {
  type = list(string)
}

variable "security_group_ids" {
  type = list(string)
}

variable "data_volume_gib" {
  type    = number
  default = 20
}

variable "cellmesh_url" {
  type = string
}

variable "telemetry" {
  description = "Metrics port, OTLP endpoint and sample ratio (see ../config)."
  type        = any
  default     = {}
}
