#!/usr/bin/env bash
# One-time AWS set-up for clusters/aws.yaml, with the AWS CLI (run it with an admin profile, once per account):
#   clusters/aws/setup.sh SSH_CIDR BUCKET [REGION] [VPC_ID]
#   e.g. clusters/aws/setup.sh 203.0.113.7/32 my-agentrl-bucket us-west-2
# Creates (names fixed, so a second run fails instead of widening anything):
#   - security group "agentrl-ray": SSH (22/tcp) from SSH_CIDR only, all traffic between members, nothing else;
#   - IAM roles + instance profiles "agentrl-ray-head" and "agentrl-ray-worker" (policies in iam/): both read/write
#     only s3://BUCKET/agentrl-ray/; the head may also launch/terminate instances tagged ray-cluster-name=agentrl-ray
#     and pass only the worker role;
# resolves the current Deep Learning AMI (Ubuntu 24.04, NVIDIA driver) once and pins its id, then writes
# ./agentrl-aws.yaml (clusters/aws.yaml with the security group, AMI and region filled in) for `ray up`.
# The bucket itself is yours (create it with block-public-access and default encryption on).
set -euo pipefail
cidr=${1:?usage: setup.sh SSH_CIDR BUCKET [REGION] [VPC_ID]}
bucket=${2:?usage: setup.sh SSH_CIDR BUCKET [REGION] [VPC_ID]}
region=${3:-us-west-2}
case "$cidr" in
  0.0.0.0/0|::/0) echo "refusing SSH from the whole internet ($cidr): give your own address/range" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
ami_parameter=/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-24.04/latest/ami-id
account=$(aws sts get-caller-identity --query Account --output text)
vpc=${4:-$(aws ec2 describe-vpcs --region "$region" --filters Name=isDefault,Values=true \
  --query 'Vpcs[0].VpcId' --output text)}

sg=$(aws ec2 create-security-group --region "$region" --vpc-id "$vpc" --group-name agentrl-ray \
  --description "agentrl_ray: SSH from one CIDR, all traffic between cluster nodes" --query GroupId --output text)
aws ec2 authorize-security-group-ingress --region "$region" --group-id "$sg" --protocol tcp --port 22 --cidr "$cidr"
aws ec2 authorize-security-group-ingress --region "$region" --group-id "$sg" --protocol -1 --source-group "$sg"

render() {
  sed -e "s|\${BUCKET}|$bucket|g" -e "s|\${ACCOUNT_ID}|$account|g" -e "s|\${REGION}|$region|g" \
      -e "s|\${SECURITY_GROUP}|$sg|g" "$1"
}
for role in head worker; do
  aws iam create-role --role-name "agentrl-ray-$role" \
    --assume-role-policy-document "file://$here/iam/trust.json" > /dev/null
  aws iam put-role-policy --role-name "agentrl-ray-$role" --policy-name checkpoint-bucket \
    --policy-document "$(render "$here/iam/checkpoint-bucket.json")"
  aws iam create-instance-profile --instance-profile-name "agentrl-ray-$role" > /dev/null
  aws iam add-role-to-instance-profile --instance-profile-name "agentrl-ray-$role" --role-name "agentrl-ray-$role"
done
aws iam put-role-policy --role-name agentrl-ray-head --policy-name autoscaler \
  --policy-document "$(render "$here/iam/head-autoscaler.json")"

ami=$(aws ssm get-parameter --region "$region" --name "$ami_parameter" --query Parameter.Value --output text)
sed -e "s|ami-PINNED-BY-SETUP-SH|$ami|" -e "s|sg-CREATED-BY-SETUP-SH|$sg|" -e "s|us-west-2|$region|g" \
  "$here/../aws.yaml" > agentrl-aws.yaml
echo "security group $sg, AMI $ami (pinned), roles agentrl-ray-head/worker; wrote ./agentrl-aws.yaml"
echo "next: ray up agentrl-aws.yaml   (run.storage_path=s3://$bucket/agentrl-ray in your job)"
