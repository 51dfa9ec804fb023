{{/* The objects' name: the release name if it contains the chart's name, else "<release>-<chart>". */}}
{{- define "crc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* The pod selector: stable across upgrades. */}}
{{- define "crc.selectorLabels" -}}
app: {{ include "crc.fullname" . }}
{{- end -}}

{{/* Labels on every object: the same two as deploy/kustomization.yaml, plus Helm's. */}}
{{- define "crc.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/part-of: cloud-route-controller
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The credentials Secret's name, or "" when no credentials come from a Secret. */}}
{{- define "crc.secretName" -}}
{{- if .Values.credentials.create -}}
{{- printf "%s-credentials" (include "crc.fullname" .) -}}
{{- else -}}
{{- .Values.credentials.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* Whether the ConfigMap (cloudConfig) is rendered: always, unless a Secret alone holds the config. */}}
{{- define "crc.configMap" -}}
{{- if or (not .Values.cloudConfigSecret.existingSecret) .Values.cloudConfig -}}
true
{{- end -}}
{{- end -}}

{{/* Refuses values that would render a controller that cannot work, with a message saying why. */}}
{{- define "crc.validate" -}}
{{- $providers := list "aws" "openstack" "hcloud" "azure" "gce" "memory" -}}
{{- if not (has .Values.provider $providers) -}}
{{- fail (printf "provider must be one of %s, got %q" (join ", " $providers) (toString .Values.provider)) -}}
{{- end -}}
{{- if not .Values.clusterCIDRs -}}
{{- fail "clusterCIDRs must list the cluster's pod CIDR(s), e.g. [10.244.0.0/16]" -}}
{{- end -}}
{{- if gt (len .Values.clusterCIDRs) 2 -}}
{{- fail (printf "clusterCIDRs takes one CIDR, or one IPv4 and one IPv6 CIDR; got %d" (len .Values.clusterCIDRs)) -}}
{{- end -}}
{{- if and (gt (int .Values.replicas) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicas is %d but leaderElection.enabled is false: several replicas without a Lease would all change routes" (int .Values.replicas)) -}}
{{- end -}}
{{- if and .Values.credentials.create .Values.credentials.existingSecret -}}
{{- fail "credentials: set either create: true (with data) or existingSecret, not both" -}}
{{- end -}}
{{- range .Values.credentials.env -}}
{{- if not (and .name .key) -}}
{{- fail (printf "every credentials.env entry needs a name (the variable) and a key (in the Secret); got %v" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.credentials.create (not .Values.credentials.data) -}}
{{- fail "credentials.create is true but credentials.data is empty" -}}
{{- end -}}
{{- if and .Values.credentials.env (not (include "crc.secretName" .)) -}}
{{- fail "credentials.env names Secret keys but there is no Secret: set credentials.existingSecret, or create: true with data" -}}
{{- end -}}
{{- if .Values.cloudConfigSecret.existingSecret -}}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString .Values.cloudConfigSecret.key)) -}}
{{- fail (printf "cloudConfigSecret.key must be a Secret key (letters, digits, '-', '_', '.'), the file's name in /etc/cloud-route-controller-secret; got %q" (toString .Values.cloudConfigSecret.key)) -}}
{{- end -}}
{{- end -}}
{{- if hasKey .Values.podLabels "app" -}}
{{- fail "podLabels must not set \"app\": it is the Deployment's pod selector" -}}
{{- end -}}
{{- $names := list "POD_NAME" "POD_NAMESPACE" -}}
{{- range concat .Values.credentials.env .Values.extraEnv -}}
{{- if not .name -}}
{{- fail (printf "every extraEnv entry needs a name; got %v" .) -}}
{{- end -}}
{{- if has .name $names -}}
{{- fail (printf "the environment variable %s is set twice (credentials.env and extraEnv, or one the chart sets itself)" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $volumes := list "cloud-config" "cloud-config-secret" -}}
{{- range .Values.extraVolumes -}}
{{- if has .name $volumes -}}
{{- fail (printf "extraVolumes: the volume name %s is taken (the chart's own, or listed twice)" (toString .name)) -}}
{{- end -}}
{{- $volumes = append $volumes .name -}}
{{- end -}}
{{- range .Values.extraVolumeMounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "extraVolumeMounts mounts %s, which is no volume of the pod (add it to extraVolumes)" (toString .name)) -}}
{{- end -}}
{{- if hasPrefix "/etc/cloud-route-controller" (toString .mountPath) -}}
{{- fail (printf "extraVolumeMounts: %s would hide or shadow the cloud config mounted at /etc/cloud-route-controller(-secret)" (toString .mountPath)) -}}
{{- end -}}
{{- end -}}
{{- if .Values.credentials.create -}}
{{- range .Values.credentials.env -}}
{{- if not (hasKey $.Values.credentials.data .key) -}}
{{- fail (printf "credentials.env %s reads key %q, which credentials.data does not have" .name .key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
