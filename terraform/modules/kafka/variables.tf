variable "enabled" {
  type    = bool
  default = false
}

variable "deployment" {
  type = string
}

variable "region" {
  type = string
}

variable "brokers" {
  description = "A multiple of the subnets (one broker per zone at least)."
  type        = number
  default     = 2
}

variable "kafka_version" {
  type    = string
  default = "3.6.0"
}

variable "instance_type" {
  type    = string
  default = "kafka.m5.large"
}

variable "volume_gib" {
  type    = number
  default = 500
}

variable "subnet_ids" {
  type = list(string)
}

variable "security_group_ids" {
  type = list(string)
}
