variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "members" {
  type    = number
  default = 3
  validation {
    condition     = var.members == 3 || var.members == 5
    error_message = "etcd runs 3 or 5 members."
  }
}

variable "client_port" {
  type    = number
  default = 2379
}

variable "peer_port" {
  type    = number
  default = 2380
}

variable "zone_id" {
  type = string
}

variable "zone_name" {
  type = string
}

variable "subnet_ids" {
  type = list(string)
}

variable "security_group_ids" {
  type = list(string)
}

variable "instance_type" {
  type    = string
  default = "t3.medium"
}

variable "ami_id" {
  type    = string
  default = ""
}

variable "data_volume_gib" {
  type    = number
  default = 20
}

variable "cellmesh_url" {
  type = string
}

variable "tls" {
  description = "The certificate bundles: the folder `cellmesh pki issue-all` wrote, the KMS key secrets are encrypted with, and the recovery window of a deleted secret (days; 0: none)."
  type = object({
    dir           = string
    kms_key_arn   = string
    recovery_days = optional(number, 7)
  })
}
